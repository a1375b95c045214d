"""The prover server: serves a run directory's openings by digest and its leaves to verifiers.

Public routes, by design and whatever the token: GET /openings/{hex digest} (streamed, HTTP
range requests, size limit), GET /runs/{run_id}/leaves (CBOR list of leaf bytes), GET /healthz.
A verifier sends no token; locking it out would make the openings count as unavailable. The
token guards the rest: GET /admin/store, the listing of the run directory's openings (digests
not yet announced on chain among them) and kept training states. State files are never served.
"""

from __future__ import annotations

import hmac
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from challenges.opening import encode_leaves
from miner.checkpoints import _STATE_RE, CheckpointError, read_leaves, read_run_meta

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 4 * 1024 * 1024 * 1024
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# One `bytes=` range of ASCII digits (RFC 9110 section 14.1.2); a position of more digits than
# RANGE_DIGITS is beyond any file this server holds, and a header longer than RANGE_MAX_CHARS is refused
# unread: neither is ever converted to an int.
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.ASCII)
RANGE_DIGITS = 19
RANGE_MAX_CHARS = 200
# What verifiers fetch: never behind the token.
PUBLIC = re.compile(r"^/(healthz|openings/[^/]*|runs/[^/]*/leaves)$")
_OPENING_RE = re.compile(r"^([0-9a-f]{64})\.opening$")


def _error(status: int, reason: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": reason}, status_code=status, headers=headers or None)


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) inclusive of a single `bytes=` range, or None when unsatisfiable/unsupported.

    Strict: ASCII digits only, no sign, one range. A position of more than RANGE_DIGITS digits is
    read as "past the end" without converting it: a first byte there is unsatisfiable, a last byte
    or a suffix length there means up to the end."""
    text = header.strip(" \t")
    if len(text) > RANGE_MAX_CHARS:
        return None
    m = _RANGE.fullmatch(text)
    if not m or (not m.group(1) and not m.group(2)):
        return None
    a, b = m.group(1), m.group(2)

    def position(digits: str) -> int | None:  # None: beyond every size
        return None if len(digits.lstrip("0")) > RANGE_DIGITS else int(digits)

    if not a:  # suffix: the last b bytes
        n = position(b)
        if n == 0 or size == 0:
            return None
        return (0 if n is None else max(0, size - n)), size - 1
    first = position(a)
    if first is None or first >= size:
        return None
    last = position(b) if b else size - 1
    if last is None:
        last = size - 1
    if last < first:
        return None
    return first, min(last, size - 1)


def _stream(path: Path, first: int, length: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        f.seek(first)
        left = length
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def create_app(run_dir: str | os.PathLike[str], *, token: str | None = None,
               max_bytes: int = DEFAULT_MAX_BYTES) -> FastAPI:
    """The prover app over one run directory (read only: it never writes to the run)."""
    run = Path(run_dir)
    app = FastAPI(title="pot prover", docs_url=None, redoc_url=None, openapi_url=None)

    def run_id() -> str | None:
        try:
            meta = read_run_meta(run)
        except CheckpointError:
            return None
        return meta["run_id"].hex() if meta else None

    @app.middleware("http")
    async def bearer(request: Request, call_next: Any) -> Any:
        path = request.url.path
        if not PUBLIC.match(path):
            if not token:
                if path == "/admin" or path.startswith("/admin/"):
                    return _error(
                        403,
                        "admin routes are off: start the prover with --token (openings, leaves "
                        "and /healthz never need one)",
                    )
            else:
                got = request.headers.get("authorization", "")
                if not hmac.compare_digest(got.encode("utf-8", "replace"), f"Bearer {token}".encode()):
                    return _error(
                        401,
                        "this route needs the prover's bearer token (Authorization: Bearer <token>); "
                        "openings, leaves and /healthz need none",
                        **{"WWW-Authenticate": "Bearer"},
                    )
        try:
            return await call_next(request)
        except Exception as exc:  # the server answers every request; it never dies on input
            return _error(500, f"internal error: {type(exc).__name__}")

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        rid = run_id()
        try:
            n = len(read_leaves(run)) if rid else 0
        except CheckpointError:
            n = 0
        return {"ok": rid is not None, "run_id": rid, "leaves": n}

    @app.get("/openings/{digest}")
    def opening(digest: str, request: Request) -> Response:
        d = digest.lower()
        if not _HEX64.match(d):
            return _error(400, "an opening is named by its 64-hex-digit digest")
        path = run / "openings" / f"{d}.opening"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return _error(404, f"no opening {d[:16]}")
        if size > max_bytes:
            return _error(413, f"opening is {size} bytes, over this server's limit of {max_bytes}")
        headers = {
            "Accept-Ranges": "bytes",
            "ETag": f'"{d}"',
            "Cache-Control": "public, max-age=31536000, immutable",
        }
        rng = request.headers.get("range")
        if rng is None:
            headers["Content-Length"] = str(size)
            return StreamingResponse(_stream(path, 0, size), media_type="application/octet-stream",
                                     headers=headers)
        span = parse_range(rng, size)
        if span is None:
            return _error(416, f"unsatisfiable or unsupported range {rng!r:.60} (one bytes= range)",
                          **{"Content-Range": f"bytes */{size}"})
        first, last = span
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        headers["Content-Length"] = str(last - first + 1)
        return StreamingResponse(_stream(path, first, last - first + 1), status_code=206,
                                 media_type="application/octet-stream", headers=headers)

    @app.get("/runs/{rid}/leaves")
    def leaves(rid: str) -> Response:
        ours = run_id()
        if ours is None or rid.lower() != ours:
            return _error(404, f"this prover serves run {ours[:16] if ours else '(none)'}, not {rid[:16]}")
        try:
            data = encode_leaves(read_leaves(run))
        except CheckpointError as exc:
            return _error(503, f"leaves unavailable: {exc}")
        return Response(data, media_type="application/cbor")

    @app.get("/admin/store")
    def store() -> dict[str, Any]:
        """The run directory as the miner sees it: every opening on disk, newest first (their
        digests are unguessable until announced on chain, so the list is private), and the kept
        training states. Sizes and times only: no file is served from here."""
        openings, states = [], []
        for p in sorted((run / "openings").glob("*.opening"), key=lambda p: -p.stat().st_mtime):
            m = _OPENING_RE.match(p.name)
            if m:
                st = p.stat()
                openings.append({"digest": m.group(1), "bytes": st.st_size, "modified": st.st_mtime})
        if (run / "states").is_dir():
            for p in sorted((run / "states").iterdir()):
                m = _STATE_RE.match(p.name)
                if m:
                    states.append({"step": int(m.group(1)), "bytes": p.stat().st_size})
        try:
            n = len(read_leaves(run)) if (run / "leaves.bin").exists() else 0
        except CheckpointError:
            n = 0
        return {"run_id": run_id(), "leaves": n, "openings": openings, "states": states}

    return app


def serve(
    run_dir: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8760,
    token: str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
    """Serve a run directory until interrupted."""
    uvicorn.run(
        create_app(run_dir, token=token, max_bytes=max_bytes), host=host, port=port, log_level="warning"
    )


class BackgroundServer:
    """The prover in a thread of this process (the trainer serves its openings while it follows)."""

    def __init__(
        self, run_dir: str | os.PathLike[str], host: str, port: int, token: str | None = None
    ) -> None:
        config = uvicorn.Config(create_app(run_dir, token=token), host=host, port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="pot-prover", daemon=True)

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the prover server did not start (is the port free?)")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


__all__ = ["BackgroundServer", "create_app", "parse_range", "serve"]
