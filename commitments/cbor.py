"""Deterministic CBOR (RFC 8949 §4.2.1 core deterministic encoding) for every hashed structure.

The encoder is ours so the bytes never depend on a library's defaults. The decoder parses with
cbor2, then re-encodes and compares: any input that is not the one canonical encoding of its
value (long-form ints, unsorted or duplicate keys, indefinite lengths, tags, non-shortest floats)
is refused with `NonCanonicalCBOR`.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import cbor2

from commitments.errors import MalformedCBOR, NonCanonicalCBOR

MAX_DEPTH = 64
MAX_DECODE_BYTES = 256 * 1024 * 1024


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([(major << 5) | n])
    if n < 1 << 8:
        return bytes([(major << 5) | 24, n])
    if n < 1 << 16:
        return bytes([(major << 5) | 25]) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes([(major << 5) | 26]) + n.to_bytes(4, "big")
    if n < 1 << 64:
        return bytes([(major << 5) | 27]) + n.to_bytes(8, "big")
    raise MalformedCBOR(f"integer {n} does not fit in 64 bits (bignums are not used)")


def _float(x: float) -> bytes:
    # Shortest of half/single/double that round-trips the value exactly (RFC 8949 §4.2.2).
    if math.isnan(x):
        return b"\xf9\x7e\x00"
    try:
        h = struct.pack(">e", x)
        if struct.unpack(">e", h)[0] == x:
            return b"\xf9" + h
    except OverflowError:
        pass
    try:
        s = struct.pack(">f", x)
        if struct.unpack(">f", s)[0] == x:
            return b"\xfa" + s
    except OverflowError:
        pass
    return b"\xfb" + struct.pack(">d", x)


def _enc(obj: Any, out: list[bytes], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise MalformedCBOR(f"structure nested deeper than {MAX_DEPTH}")
    if obj is False:
        out.append(b"\xf4")
    elif obj is True:
        out.append(b"\xf5")
    elif obj is None:
        out.append(b"\xf6")
    elif isinstance(obj, int):
        out.append(_head(0, obj) if obj >= 0 else _head(1, -1 - obj))
    elif isinstance(obj, float):
        out.append(_float(obj))
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        b = bytes(obj)
        out.append(_head(2, len(b)))
        out.append(b)
    elif isinstance(obj, str):
        b = obj.encode("utf-8")
        out.append(_head(3, len(b)))
        out.append(b)
    elif isinstance(obj, (list, tuple)):
        out.append(_head(4, len(obj)))
        for item in obj:
            _enc(item, out, depth + 1)
    elif isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            kb: list[bytes] = []
            _enc(k, kb, depth + 1)
            items.append((b"".join(kb), v))
        items.sort(key=lambda kv: kv[0])
        for a, b in zip(items, items[1:], strict=False):
            if a[0] == b[0]:
                raise MalformedCBOR("map has two keys with the same encoding")
        out.append(_head(5, len(items)))
        for kb_, v in items:
            out.append(kb_)
            _enc(v, out, depth + 1)
    else:
        raise MalformedCBOR(f"type {type(obj).__name__} has no place in a protocol structure")


def encode(obj: Any) -> bytes:
    """Encode `obj` (None, bool, int, float, bytes, str, list/tuple, dict) deterministically."""
    out: list[bytes] = []
    _enc(obj, out, 0)
    return b"".join(out)


def _check_types(obj: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise MalformedCBOR(f"structure nested deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, (bool, int, float, bytes, str)):
        return
    if isinstance(obj, list):
        for x in obj:
            _check_types(x, depth + 1)
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_types(k, depth + 1)
            _check_types(v, depth + 1)
        return
    raise MalformedCBOR(f"CBOR item of type {type(obj).__name__} (tag or special value) is not allowed")


def decode(data: bytes, *, max_bytes: int = MAX_DECODE_BYTES) -> Any:
    """Decode canonical CBOR; refuse anything else with a reason."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedCBOR(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise MalformedCBOR(f"CBOR document of {len(data)} bytes exceeds the limit of {max_bytes}")
    if not data:
        raise MalformedCBOR("empty input is not a CBOR item")
    try:
        obj = cbor2.loads(data)
    except RecursionError as exc:
        raise MalformedCBOR("CBOR nesting too deep") from exc
    except Exception as exc:  # cbor2 raises several types; all mean the same to a caller
        raise MalformedCBOR(f"not valid CBOR: {exc}") from exc
    _check_types(obj)
    try:
        again = encode(obj)
    except MalformedCBOR as exc:
        raise NonCanonicalCBOR(f"not canonical CBOR: {exc}") from exc
    if again != data:
        # Find the first differing byte so the reason points somewhere useful.
        i = next((j for j, (a, b) in enumerate(zip(again, data, strict=False)) if a != b), min(len(again), len(data)))
        if len(data) > len(again) and data[: len(again)] == again:
            raise NonCanonicalCBOR(f"trailing bytes after the CBOR item at offset {len(again)}")
        raise NonCanonicalCBOR(
            f"not RFC 8949 core deterministic encoding: first difference at byte {i}"
        )
    return obj
