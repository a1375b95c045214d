"""The miner's signed run transcript: an append-only file of canonical CBOR records.

Record 0 (the root) names the protocol version, run, build identity, the Ed25519 session public
key, the time and a nonce. Every later record carries its index, a kind, a CBOR map payload and
`prev`, the digest of the previous record. Every record, the root included, carries `sig`: an
Ed25519 signature by the session key over CBOR(["pot/transcript/sig/v1", record without sig]).

Record digest = digest("pot/transcript/record/v1", the record's exact bytes). The file is the
records' concatenation and is checked offline by `verify_transcript`, which names the first
problem and its record index. Dropping trailing whole records cannot be seen from the file
alone; compare the report's `head` and `records` with an external anchor for that.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import platform
import time as _time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey, VerifyKey

from commitments import cbor
from commitments.errors import CommitmentError, NonCanonicalCBOR
from commitments.files import atomic_write_bytes
from commitments.hashing import DIGEST_SIZE, digest, structure_bytes

TRANSCRIPT_VERSION = "pot/transcript/v1"
SIG_DOMAIN = "pot/transcript/sig/v1"
RECORD_DOMAIN = "pot/transcript/record/v1"
ROOT_KIND = "root"
MAX_RECORD_BYTES = 16 * 1024 * 1024
NONCE_SIZE = 16
SIGNATURE_SIZE = 64
PUBLIC_KEY_SIZE = 32

ROOT_FIELDS = frozenset({"v", "index", "kind", "run", "build", "session_key", "time", "nonce", "sig"})
RECORD_FIELDS = frozenset({"index", "kind", "payload", "prev", "sig"})

# Reason codes of `TranscriptProblem.reason`.
EMPTY = "empty"
TRUNCATED = "truncated"
MALFORMED = "malformed"
NON_CANONICAL = "non-canonical"
BAD_ROOT = "bad-root"
OUT_OF_SEQUENCE = "out-of-sequence"
BROKEN_LINK = "broken-link"
BAD_SIGNATURE = "bad-signature"


class TranscriptError(CommitmentError):
    """A transcript that cannot be written to or resumed, with the reason."""


@dataclass(frozen=True)
class TranscriptRecord:
    index: int
    kind: str
    fields: dict[str, Any]
    raw: bytes
    offset: int

    @property
    def digest(self) -> bytes:
        return record_digest(self.raw)

    @property
    def payload(self) -> dict[str, Any]:
        return self.fields.get("payload", {})


@dataclass(frozen=True)
class TranscriptProblem:
    index: int  # the record where the problem is (the index it should have had)
    offset: int  # byte offset of that record in the file
    reason: str  # one of the reason codes above
    detail: str

    def __str__(self) -> str:
        return f"record {self.index} (byte {self.offset}): {self.reason}: {self.detail}"


@dataclass
class TranscriptReport:
    ok: bool
    records: int  # records that verified, counted from the root
    run_name: str | None = None
    session_key: bytes | None = None
    protocol_version: str | None = None
    build: dict[str, Any] | None = None
    time: int | None = None
    head: bytes | None = None  # digest of the last record that verified
    valid_bytes: int = 0  # length of the verified prefix
    problem: TranscriptProblem | None = None
    kinds: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "run_name": self.run_name,
            "protocol_version": self.protocol_version,
            "session_key": self.session_key.hex() if self.session_key else None,
            "build": self.build,
            "time": self.time,
            "head": self.head.hex() if self.head else None,
            "kinds": self.kinds,
            "problem": None if self.problem is None else {
                "index": self.problem.index,
                "offset": self.problem.offset,
                "reason": self.problem.reason,
                "detail": self.problem.detail,
            },
        }


# --- pure parts ---------------------------------------------------------------------------------


def record_digest(raw: bytes) -> bytes:
    return digest(RECORD_DOMAIN, bytes(raw))


def signing_message(unsigned: dict[str, Any]) -> bytes:
    return structure_bytes(SIG_DOMAIN, unsigned)


def build_identity() -> dict[str, str]:
    """Package, Python and torch versions, read from metadata (torch itself is not imported)."""
    return {
        "package": _package_version(),
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
    }


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _package_version() -> str:
    try:
        return "pot-verifier " + importlib.metadata.version("pot-verifier")
    except importlib.metadata.PackageNotFoundError:
        pass
    # A source checkout that was not installed: the version in pyproject.toml.
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        meta = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        return f"{meta['name']} {meta['version']} (source)"
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "pot-verifier unknown"


class _Truncated(Exception):
    pass


class _Bad(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _item_end(data: bytes, pos: int) -> int:
    """End offset of the CBOR item at `pos`, walking heads only (no decoding, no recursion)."""
    start, remaining = pos, 1
    while remaining:
        if pos >= len(data):
            raise _Truncated
        ib = data[pos]
        major, ai = ib >> 5, ib & 0x1F
        pos += 1
        if ai < 24:
            arg = ai
        elif ai <= 27:
            width = 1 << (ai - 24)
            if pos + width > len(data):
                raise _Truncated
            arg = int.from_bytes(data[pos:pos + width], "big")
            pos += width
        elif ai == 31:
            raise _Bad(NON_CANONICAL, "indefinite-length item (not core deterministic encoding)")
        else:
            raise _Bad(MALFORMED, f"reserved CBOR header byte 0x{ib:02x}")
        remaining -= 1
        if major in (2, 3):
            if arg > MAX_RECORD_BYTES:
                raise _Bad(MALFORMED, f"string of {arg} bytes exceeds the record limit")
            pos += arg
            if pos > len(data):
                raise _Truncated
        elif major == 4:
            remaining += arg
        elif major == 5:
            remaining += 2 * arg
        elif major == 6:
            remaining += 1
        if pos - start > MAX_RECORD_BYTES:
            raise _Bad(MALFORMED, f"record exceeds {MAX_RECORD_BYTES} bytes")
    return pos


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_shape(obj: Any, index: int) -> None:
    if not isinstance(obj, dict):
        raise _Bad(MALFORMED, f"a record is a CBOR map, got {type(obj).__name__}")
    if not isinstance(obj.get("sig"), bytes) or len(obj["sig"]) != SIGNATURE_SIZE:
        raise _Bad(MALFORMED, f"'sig' must be {SIGNATURE_SIZE} bytes")
    if index == 0:
        keys = set(obj)
        if keys != ROOT_FIELDS:
            raise _Bad(BAD_ROOT, f"root record fields {sorted(map(str, keys))} != {sorted(ROOT_FIELDS)}")
        if obj["v"] != TRANSCRIPT_VERSION:
            raise _Bad(BAD_ROOT, f"protocol version {obj['v']!r} is not {TRANSCRIPT_VERSION!r}")
        if obj["index"] != 0 or obj["kind"] != ROOT_KIND:
            raise _Bad(BAD_ROOT, "the first record must have index 0 and kind 'root'")
        if not isinstance(obj["run"], str) or not obj["run"]:
            raise _Bad(BAD_ROOT, "'run' must be a non-empty string")
        build = obj["build"]
        if not isinstance(build, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in build.items()):
            raise _Bad(BAD_ROOT, "'build' must be a map of strings")
        if not isinstance(obj["session_key"], bytes) or len(obj["session_key"]) != PUBLIC_KEY_SIZE:
            raise _Bad(BAD_ROOT, f"'session_key' must be {PUBLIC_KEY_SIZE} bytes")
        if not _is_uint(obj["time"]):
            raise _Bad(BAD_ROOT, "'time' must be a non-negative int (Unix seconds)")
        if not isinstance(obj["nonce"], bytes) or len(obj["nonce"]) != NONCE_SIZE:
            raise _Bad(BAD_ROOT, f"'nonce' must be {NONCE_SIZE} bytes")
        return
    keys = set(obj)
    if keys != RECORD_FIELDS:
        raise _Bad(MALFORMED, f"record fields {sorted(map(str, keys))} != {sorted(RECORD_FIELDS)}")
    if not _is_uint(obj["index"]):
        raise _Bad(MALFORMED, f"'index' must be a non-negative int, got {obj['index']!r}")
    if obj["index"] != index:
        raise _Bad(OUT_OF_SEQUENCE, f"record carries index {obj['index']}, expected {index}")
    if not isinstance(obj["kind"], str) or not obj["kind"] or obj["kind"] == ROOT_KIND:
        raise _Bad(MALFORMED, f"'kind' must be a non-empty string other than 'root', got {obj['kind']!r}")
    if not isinstance(obj["payload"], dict):
        raise _Bad(MALFORMED, "'payload' must be a CBOR map")
    if not isinstance(obj["prev"], bytes) or len(obj["prev"]) != DIGEST_SIZE:
        raise _Bad(MALFORMED, f"'prev' must be a {DIGEST_SIZE}-byte digest")


def _check_signature(obj: dict[str, Any], key: VerifyKey) -> None:
    unsigned = {k: v for k, v in obj.items() if k != "sig"}
    try:
        key.verify(signing_message(unsigned), obj["sig"])
    except (BadSignatureError, CryptoError):
        raise _Bad(BAD_SIGNATURE, "signature does not verify under the session key") from None


def iter_records(data: bytes) -> Iterator[TranscriptRecord | TranscriptProblem]:
    """Yield verified records in order; the first problem is yielded last, then iteration stops."""
    data = bytes(data)
    if not data:
        yield TranscriptProblem(0, 0, EMPTY, "the transcript has no records")
        return
    pos, index = 0, 0
    key: VerifyKey | None = None
    prev: bytes | None = None
    while pos < len(data):
        try:
            try:
                end = _item_end(data, pos)
            except _Truncated:
                raise _Bad(TRUNCATED, f"partial trailing record ({len(data) - pos} bytes)") from None
            raw = data[pos:end]
            try:
                obj = cbor.decode(raw, max_bytes=MAX_RECORD_BYTES)
            except NonCanonicalCBOR as exc:
                raise _Bad(NON_CANONICAL, str(exc)) from None
            except CommitmentError as exc:
                raise _Bad(MALFORMED, str(exc)) from None
            _check_shape(obj, index)
            if index == 0:
                key = VerifyKey(obj["session_key"])
            else:
                if obj["prev"] != prev:
                    raise _Bad(BROKEN_LINK, "'prev' is not the digest of the previous record")
            assert key is not None
            _check_signature(obj, key)
        except _Bad as bad:
            yield TranscriptProblem(index, pos, bad.reason, bad.detail)
            return
        yield TranscriptRecord(index, obj["kind"], obj, raw, pos)
        prev = record_digest(raw)
        pos, index = end, index + 1


def verify_transcript(source: bytes | bytearray | str | os.PathLike[str]) -> TranscriptReport:
    """Check a whole transcript (file path or bytes) offline."""
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise TranscriptError(f"{source}: cannot read transcript: {exc.strerror or exc}") from None
    report = TranscriptReport(ok=False, records=0)
    for item in iter_records(data):
        if isinstance(item, TranscriptProblem):
            report.problem = item
            return report
        if item.index == 0:
            f = item.fields
            report.run_name, report.session_key = f["run"], f["session_key"]
            report.protocol_version, report.build, report.time = f["v"], f["build"], f["time"]
        report.records += 1
        report.kinds[item.kind] = report.kinds.get(item.kind, 0) + 1
        report.head = item.digest
        report.valid_bytes = item.offset + len(item.raw)
    report.ok = True
    return report


def make_root(signing_key: SigningKey, run_name: str, *, build: dict[str, str] | None = None,
              time: int | None = None, nonce: bytes | None = None) -> bytes:
    """The signed root record's bytes."""
    if not isinstance(run_name, str) or not run_name:
        raise TranscriptError("run name must be a non-empty string")
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_SIZE:
        raise TranscriptError(f"nonce must be {NONCE_SIZE} bytes")
    unsigned = {
        "v": TRANSCRIPT_VERSION,
        "index": 0,
        "kind": ROOT_KIND,
        "run": run_name,
        "build": build_identity() if build is None else dict(build),
        "session_key": bytes(signing_key.verify_key),
        "time": int(_time.time()) if time is None else time,
        "nonce": nonce,
    }
    return _sign(signing_key, unsigned)


def make_record(
    signing_key: SigningKey, index: int, kind: str, payload: dict[str, Any], prev: bytes
) -> bytes:
    """The signed bytes of record `index` following the record whose digest is `prev`."""
    if not isinstance(kind, str) or not kind or kind == ROOT_KIND:
        raise TranscriptError(f"record kind must be a non-empty string other than 'root', got {kind!r}")
    if not isinstance(payload, dict):
        raise TranscriptError(f"record payload must be a dict (a CBOR map), got {type(payload).__name__}")
    return _sign(signing_key, {"index": index, "kind": kind, "payload": payload, "prev": prev})


def _sign(signing_key: SigningKey, unsigned: dict[str, Any]) -> bytes:
    try:
        sig = signing_key.sign(signing_message(unsigned)).signature
        raw = cbor.encode({**unsigned, "sig": sig})
    except CommitmentError as exc:
        raise TranscriptError(f"record cannot be encoded: {exc}") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise TranscriptError(f"record of {len(raw)} bytes exceeds the limit of {MAX_RECORD_BYTES}")
    return raw


# --- session keys and the writer (I/O) ----------------------------------------------------------


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write a new file atomically; refuse to replace an existing one."""
    try:
        atomic_write_bytes(path, data, mode=mode, replace=False)
    except FileExistsError:
        raise TranscriptError(f"{path}: already exists; resume it or choose another path") from None


def save_session_key(path: str | os.PathLike[str], key: SigningKey) -> None:
    """Store the session key's 32-byte seed (mode 0600) so a writer can resume later."""
    _write_new(Path(path), bytes(key), 0o600)


def load_session_key(path: str | os.PathLike[str]) -> SigningKey:
    p = Path(path)
    try:
        seed = p.read_bytes()
    except OSError as exc:
        raise TranscriptError(f"{p}: cannot read session key: {exc.strerror or exc}") from None
    if len(seed) != 32:
        raise TranscriptError(f"{p}: a session key file holds a 32-byte seed, found {len(seed)} bytes")
    return SigningKey(seed)


class TranscriptWriter:
    """Appends signed records to one transcript file, fsyncing each; holds an exclusive lock."""

    def __init__(self, path: Path, fd: int, signing_key: SigningKey, count: int, head: bytes,
                 run_name: str) -> None:
        self.path = path
        self._fd = fd
        self._key = signing_key
        self.count = count
        self.head = head
        self.run_name = run_name

    @staticmethod
    def _open_locked(path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TranscriptError(f"{path}: another writer holds this transcript open") from None
        return fd

    @classmethod
    def create(cls, path: str | os.PathLike[str], run_name: str, signing_key: SigningKey | None = None, *,
               build: dict[str, str] | None = None, time: int | None = None,
               nonce: bytes | None = None) -> TranscriptWriter:
        """Start a new transcript whose root record is written atomically."""
        p = Path(path)
        key = SigningKey.generate() if signing_key is None else signing_key
        root = make_root(key, run_name, build=build, time=time, nonce=nonce)
        _write_new(p, root, 0o644)
        return cls(p, cls._open_locked(p), key, 1, record_digest(root), run_name)

    @classmethod
    def resume(cls, path: str | os.PathLike[str], signing_key: SigningKey, *,
               drop_partial_tail: bool = False) -> TranscriptWriter:
        """Reopen an existing transcript after verifying it end to end.

        A crash during an append can leave a partial last record; with `drop_partial_tail` that
        tail is cut off (the only repair ever made), any other problem refuses to resume.
        """
        p = Path(path)
        if not p.is_file():
            raise TranscriptError(f"{p}: no such transcript")
        fd = cls._open_locked(p)
        try:
            report = verify_transcript(p)
            if not report.ok:
                assert report.problem is not None
                if not (drop_partial_tail and report.problem.reason == TRUNCATED and report.records > 0):
                    raise TranscriptError(f"{p}: cannot resume: {report.problem}")
                os.ftruncate(fd, report.valid_bytes)
                os.fsync(fd)
            if report.session_key != bytes(signing_key.verify_key):
                raise TranscriptError(f"{p}: the given key is not this transcript's session key")
            assert report.head is not None and report.run_name is not None
            return cls(p, fd, signing_key, report.records, report.head, report.run_name)
        except BaseException:
            os.close(fd)
            raise

    @property
    def session_public_key(self) -> bytes:
        return bytes(self._key.verify_key)

    def append(self, kind: str, payload: dict[str, Any]) -> TranscriptRecord:
        """Sign and durably append one record; returns it."""
        if self._fd < 0:
            raise TranscriptError(f"{self.path}: the writer is closed")
        raw = make_record(self._key, self.count, kind, payload, self.head)
        offset = os.lseek(self._fd, 0, os.SEEK_END)
        view = memoryview(raw)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        rec = TranscriptRecord(self.count, kind, cbor.decode(raw), raw, offset)
        self.head = rec.digest
        self.count += 1
        return rec

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "BAD_ROOT",
    "BAD_SIGNATURE",
    "BROKEN_LINK",
    "EMPTY",
    "MALFORMED",
    "NON_CANONICAL",
    "OUT_OF_SEQUENCE",
    "TRANSCRIPT_VERSION",
    "TRUNCATED",
    "TranscriptError",
    "TranscriptProblem",
    "TranscriptRecord",
    "TranscriptReport",
    "TranscriptWriter",
    "build_identity",
    "iter_records",
    "load_session_key",
    "make_record",
    "make_root",
    "record_digest",
    "save_session_key",
    "verify_transcript",
]
