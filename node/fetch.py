"""Downloads from miners' provers: openings streamed to disk, leaf lists into memory.

Every request has connect/read/total timeouts and a size cap; transient failures are retried with
exponential backoff and full jitter, and a partial download resumes with an HTTP Range request.
Files appear atomically (commitments.files.publish: fsync, rename, fsync the folder).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx

from commitments.files import publish
from commitments.retry import Backoff

CHUNK = 1 << 20


class FetchError(Exception):
    """A download that failed; `kind` is one of bad_uri, too_large, http_status, unreachable."""

    def __init__(self, kind: str, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.retryable = retryable


@dataclass(frozen=True)
class FetchPolicy:
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 300.0
    attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 15.0

    @cached_property
    def _backoff(self) -> Backoff:
        return Backoff(self.backoff_base_s, self.backoff_max_s)

    def backoff(self, attempt: int) -> float:
        """The delay before retry `attempt` (0-based): full jitter, see commitments.retry."""
        return self._backoff.delay(attempt)

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_timeout_s, read=self.read_timeout_s,
                             write=self.read_timeout_s, pool=self.connect_timeout_s)


def resolve_uri(uri: str, endpoint: str) -> str:
    """The http(s) URL of an opening: absolute as given, or relative to the run's endpoint."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        url = uri
    elif parts.scheme == "" and endpoint:
        base = endpoint if endpoint.endswith("/") else endpoint + "/"
        url = urljoin(base, uri.lstrip("/"))
    else:
        # Never let a chain record make the node read local files or speak other protocols.
        raise FetchError("bad_uri", f"opening URI {uri[:200]!r} is not http(s) (endpoint {endpoint[:200]!r})")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise FetchError("bad_uri", f"opening URL {url[:200]!r} is not an absolute http(s) URL")
    return url


def _status_error(resp: httpx.Response, url: str) -> FetchError:
    code = resp.status_code
    retryable = code in (408, 425, 429) or code >= 500
    return FetchError("http_status", f"GET {url} answered HTTP {code}", retryable=retryable)


class FetchStopped(Exception):
    """The node is shutting down; the partial file stays for the next start to resume."""


def _one_attempt(client: httpx.Client, url: str, part: Path, max_bytes: int, policy: FetchPolicy,
                 stop=None) -> int:
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    started = time.monotonic()
    with client.stream("GET", url, headers=headers) as resp:
        if resp.status_code == 416 and have:
            part.unlink()  # our partial file is not a prefix of what the server has now
            raise FetchError("http_status", f"GET {url}: range not satisfiable; restarting", retryable=True)
        if resp.status_code not in (200, 206):
            raise _status_error(resp, url)
        if resp.status_code == 200:
            have = 0  # the server ignored the range: start over
        length = resp.headers.get("content-length")
        if length is not None and length.isdigit() and have + int(length) > max_bytes:
            raise FetchError("too_large", f"GET {url}: {have + int(length)} bytes announced, the cap is {max_bytes}")
        with part.open("r+b" if have else "wb") as f:
            f.seek(have)
            f.truncate()
            total = have
            # Unchunked iteration hands over bytes as they arrive, so a cut keeps what came.
            for chunk in resp.iter_bytes():
                total += len(chunk)
                if total > max_bytes:
                    raise FetchError("too_large", f"GET {url}: more than the cap of {max_bytes} bytes")
                if time.monotonic() - started > policy.total_timeout_s:
                    raise FetchError("unreachable", f"GET {url}: not finished within {policy.total_timeout_s:g} s",
                                     retryable=True)
                if stop is not None and stop():
                    raise FetchStopped(f"GET {url}: stopped at {total} bytes")
                f.write(chunk)
    return total


def fetch_to_file(url: str, dest: str | os.PathLike[str], *, max_bytes: int,
                  policy: FetchPolicy | None = None, stop=None) -> int:
    """Stream `url` into `dest` (atomically); return its size. Raises FetchError after the last try."""
    policy = policy or FetchPolicy()
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    last: FetchError | None = None
    with httpx.Client(timeout=policy.timeout(), follow_redirects=True, max_redirects=3) as client:
        for attempt in range(policy.attempts):
            if stop is not None and stop():
                raise FetchStopped(f"GET {url}: stopped before attempt {attempt + 1}")
            try:
                size = _one_attempt(client, url, part, max_bytes, policy, stop)
                publish(part, dest)
                return size
            except FetchError as exc:
                last = exc
                if not exc.retryable:
                    part.unlink(missing_ok=True)
                    raise
            except httpx.HTTPError as exc:
                last = FetchError("unreachable", f"GET {url}: {type(exc).__name__}: {exc}", retryable=True)
            if attempt + 1 < policy.attempts:
                time.sleep(policy.backoff(attempt))
    raise last or FetchError("unreachable", f"GET {url}: no attempt was made")


def fetch_bytes(url: str, *, max_bytes: int, policy: FetchPolicy | None = None) -> bytes:
    """GET a small document (a leaf list) into memory, capped and retried like `fetch_to_file`."""
    policy = policy or FetchPolicy()
    last: FetchError | None = None
    with httpx.Client(timeout=policy.timeout(), follow_redirects=True, max_redirects=3) as client:
        for attempt in range(policy.attempts):
            try:
                started = time.monotonic()
                with client.stream("GET", url) as resp:
                    if resp.status_code != 200:
                        raise _status_error(resp, url)
                    buf = bytearray()
                    for chunk in resp.iter_bytes(CHUNK):
                        buf += chunk
                        if len(buf) > max_bytes:
                            raise FetchError("too_large", f"GET {url}: more than the cap of {max_bytes} bytes")
                        if time.monotonic() - started > policy.total_timeout_s:
                            raise FetchError("unreachable", f"GET {url}: too slow", retryable=True)
                    return bytes(buf)
            except FetchError as exc:
                last = exc
                if not exc.retryable:
                    raise
            except httpx.HTTPError as exc:
                last = FetchError("unreachable", f"GET {url}: {type(exc).__name__}: {exc}", retryable=True)
            if attempt + 1 < policy.attempts:
                time.sleep(policy.backoff(attempt))
    raise last  # type: ignore[misc]


__all__ = ["FetchError", "FetchPolicy", "FetchStopped", "fetch_bytes", "fetch_to_file", "resolve_uri"]
