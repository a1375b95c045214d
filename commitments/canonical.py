"""Why bytes are not the canonical CBOR of a value: the first field that differs, and the form it
needs.

A record (a spec, a parameter set) is accepted only byte-identical to its canonical encoding. When
another encoder's bytes differ, "not canonical" alone cannot be acted on; `first_difference` names
the field (as a dotted path) and says what the canonical form holds there, e.g.
"optimizer.grad_clip: a float must be encoded as a float (f93c00), got the integer 1".

Both functions only read: they never raise on any input, and their answers are bounded in size.
"""

from __future__ import annotations

import struct
from typing import Any

from commitments import cbor
from commitments.errors import CommitmentError

MAX_ANSWER = 240
_MAX_DEPTH = 32


def first_difference(given: bytes, canonical: bytes) -> str:
    """Where `given` first departs from `canonical` (the canonical CBOR of the same value)."""
    try:
        return _cut(_first_difference(bytes(given), bytes(canonical)))
    except Exception:  # a diagnosis never stops the refusal it explains
        return "the bytes differ from the canonical encoding"


def _first_difference(given: bytes, canonical: bytes) -> str:
    if given == canonical:
        return "no difference"
    want = cbor.decode(canonical)
    try:
        got = cbor.decode(given)
    except CommitmentError as exc:
        return describe_refusal(given, exc)
    found = _compare(got, want, "")
    if found is not None:
        return found
    return f"the bytes differ from the canonical encoding at offset {_mismatch(given, canonical)}"


def describe_refusal(data: bytes, exc: CommitmentError) -> str:
    """A strict-decoder refusal of `data`, with the field its offset falls in named."""
    offset = getattr(exc, "offset", None)
    rule = getattr(exc, "rule", "unspecified")
    what = _RULES.get(rule, str(exc))
    if not isinstance(offset, int):
        return _cut(what)
    path = _path_at(bytes(data), offset)
    where = f"{path}: " if path else ""
    return _cut(f"{where}{what} (byte {offset})")


_RULES = {
    "float-form": "a float must be in its shortest exact width (half, single, then double precision)",
    "key-order": "map keys must be sorted by their encoded bytes (shorter keys first, then bytewise)",
    "duplicate-key": "a map key appears twice",
    "head-form": "an integer or length must use its shortest head",
    "indefinite-length": "indefinite-length items are not canonical: give every length",
    "tag": "tags are not used: encode the plain value",
    "trailing-bytes": "bytes follow the end of the item",
}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "text"
    if isinstance(v, (bytes, bytearray)):
        return "bytes"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "a map"
    if v is None:
        return "null"
    return type(v).__name__


def _the(v: Any) -> str:
    text = repr(v) if not isinstance(v, (bytes, bytearray)) else f"{len(v)} bytes"
    return (
        f"{_kind(v).removeprefix('a ').removeprefix('an ')} {text}"
        if not isinstance(v, (list, dict))
        else _kind(v)
    )


def _enc_hex(v: Any) -> str:
    h = cbor.encode(v).hex()
    return h if len(h) <= 32 else h[:32] + "..."


def _compare(got: Any, want: Any, path: str, depth: int = 0) -> str | None:
    where = path or "(the whole record)"
    if depth > _MAX_DEPTH:
        return None
    if _kind(got) != _kind(want):
        return (f"{where}: {_kind(want)} must be encoded as {_kind(want)} ({_enc_hex(want)}), "
                f"got the {_the(got)}")
    if isinstance(want, dict):
        for k in sorted(want, key=lambda k: cbor.encode(k)):
            if k not in got:
                return (f"{_join(path, k)}: missing; the canonical form holds every field, defaults included "
                        f"(here {_enc_hex(want[k])})")
        for k in got:
            if k not in want:
                return (f"{_join(path, k)}: not in the canonical form (drop it: an unknown field, or one the "
                        f"canonical form leaves out at its default)")
        keys = list(got)
        if keys != sorted(keys, key=lambda k: cbor.encode(k)):
            return (
                f"{where}: map keys must be sorted by their encoded bytes (shorter keys first, then bytewise)"
            )
        for k in sorted(want, key=lambda k: cbor.encode(k)):
            found = _compare(got[k], want[k], _join(path, k), depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(want, list):
        if len(got) != len(want):
            return f"{where}: an array of {len(want)} items, got {len(got)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            found = _compare(g, w, f"{path}[{i}]", depth + 1)
            if found is not None:
                return found
        return None
    if got != want or cbor.encode(got) != cbor.encode(want):
        return f"{where}: the canonical value is {_the(want)} ({_enc_hex(want)}), got {_the(got)}"
    return None


def _join(path: str, key: Any) -> str:
    k = key if isinstance(key, str) else repr(key)
    return f"{path}.{k}" if path else k


def _mismatch(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ANSWER else text[: MAX_ANSWER - 3] + "..."


# --- a lenient walk: which field holds byte `offset` (the strict decoder has refused the bytes) ----


class _Stop(Exception):
    pass


def _path_at(data: bytes, offset: int) -> str:
    """The dotted path of the innermost item holding `offset`, or "" where the walk cannot tell."""
    path: list[str] = []
    try:
        _walk(data, 0, offset, path, 0)
    except _Stop:
        pass
    except Exception:
        return ""
    return ".".join(path).replace(".[", "[")


def _head(data: bytes, pos: int) -> tuple[int, int, int, int]:
    """(major type, additional info, argument, position after the head)."""
    b = data[pos]
    major, ai = b >> 5, b & 31
    if ai < 24:
        return major, ai, ai, pos + 1
    if ai in (24, 25, 26, 27):
        width = 1 << (ai - 24)
        if pos + 1 + width > len(data):
            raise ValueError("truncated")
        return major, ai, int.from_bytes(data[pos + 1:pos + 1 + width], "big"), pos + 1 + width
    if ai == 31:
        return major, ai, -1, pos + 1
    raise ValueError("reserved")


def _walk(data: bytes, pos: int, offset: int, path: list[str], depth: int) -> tuple[Any, int]:
    """Skip one item from `pos`; stop (raise _Stop) once an item starting at `offset` is reached."""
    if depth > _MAX_DEPTH or pos >= len(data):
        raise ValueError("too deep or truncated")
    if pos == offset:
        raise _Stop
    major, ai, arg, p = _head(data, pos)
    if major in (0, 1):
        return (arg if major == 0 else -1 - arg), p
    if major in (2, 3):
        if arg < 0:
            raise _Stop  # an indefinite string: the offset is at or inside it
        end = p + arg
        if offset < end:
            raise _Stop
        raw = data[p:end]
        return (raw.decode("utf-8", "replace") if major == 3 else raw), end
    if major == 4:
        for i in range(arg if arg >= 0 else 1 << 30):
            if arg < 0 and data[p] == 0xFF:
                return None, p + 1
            path.append(f"[{i}]")
            _, p2 = _walk(data, p, offset, path, depth + 1)
            path.pop()
            p = p2
        return None, p
    if major == 5:
        for _ in range(arg if arg >= 0 else 1 << 30):
            if arg < 0 and data[p] == 0xFF:
                return None, p + 1
            if p == offset:
                raise _Stop  # a key itself is at fault (its order): the map is the place
            key, p2 = _walk(data, p, offset, path, depth + 1)
            path.append(key if isinstance(key, str) else repr(key))
            _, p3 = _walk(data, p2, offset, path, depth + 1)
            path.pop()
            p = p3
        return None, p
    if major == 6:
        raise _Stop
    if ai in (25, 26, 27):
        width = {25: 2, 26: 4, 27: 8}[ai]
        form = {25: ">e", 26: ">f", 27: ">d"}[ai]
        return struct.unpack(form, data[p - width:p])[0], p
    return None, p
