"""Deterministic CBOR (RFC 8949 §4.2.1 core deterministic encoding) for every hashed structure.

The encoder is ours so the bytes never depend on a library's defaults. The decoder is ours too,
and it is the one parser for every CBOR input that arrives from outside (remarks, manifests, leaf
lists, specs, snapshots, recipes): one pass, no recursion, no tags, and it accepts only the one
canonical encoding our encoder writes. Anything else is refused with a typed error
(`MalformedCBOR`, `NonCanonicalCBOR`, `CBORLimitExceeded`) naming the offset and the rule broken.
Work is linear in the input: a claimed length or item count is checked against the bytes that
remain before anything is built, and no message ever formats a value taken from the input.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from commitments.errors import CBORLimitExceeded, MalformedCBOR, NonCanonicalCBOR

MAX_DEPTH = 64
MAX_DECODE_BYTES = 256 * 1024 * 1024
# Every item costs a Python object; the cap keeps a document of tiny items (b"\x80" * n) from
# costing tens of bytes of memory per input byte. A leaf list of 512 MiB holds far fewer items.
MAX_DECODE_ITEMS = 1 << 24
MAX_STRING_BYTES = MAX_DECODE_BYTES


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
    # Never put the integer in the message: one past Python's int-to-str digit limit raises.
    raise MalformedCBOR("an integer does not fit in 64 bits (bignums are not used)", rule="integer-range")


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
        raise MalformedCBOR(f"structure nested deeper than {MAX_DEPTH}", rule="too-deep")
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
                raise MalformedCBOR("map has two keys with the same encoding", rule="duplicate-key")
        out.append(_head(5, len(items)))
        for kb_, v in items:
            out.append(kb_)
            _enc(v, out, depth + 1)
    else:
        raise MalformedCBOR(f"type {type(obj).__name__} has no place in a protocol structure", rule="type")


def encode(obj: Any) -> bytes:
    """Encode `obj` (None, bool, int, float, bytes, str, list/tuple, dict) deterministically."""
    out: list[bytes] = []
    _enc(obj, out, 0)
    return b"".join(out)


# --- the strict decoder --------------------------------------------------------------------------


def _bad(offset: int, rule: str, what: str) -> MalformedCBOR:
    return MalformedCBOR(f"not valid CBOR at offset {offset}: {what}", rule=rule, offset=offset)


def _refused(offset: int, rule: str, what: str) -> MalformedCBOR:
    return MalformedCBOR(f"CBOR item at offset {offset}: {what}", rule=rule, offset=offset)


def _noncanonical(offset: int, rule: str, what: str) -> NonCanonicalCBOR:
    return NonCanonicalCBOR(f"not RFC 8949 core deterministic encoding at offset {offset}: {what}",
                            rule=rule, offset=offset)


def _limit(offset: int, rule: str, what: str) -> CBORLimitExceeded:
    return CBORLimitExceeded(f"CBOR refused at offset {offset}: {what}", rule=rule, offset=offset)


def _truncated(offset: int, what: str) -> MalformedCBOR:
    return _bad(offset, "truncated", f"{what} runs past the end of the input")


_NOKEY = object()  # a map frame waiting for its next key
_HEAD_FLOOR = {25: 1 << 8, 26: 1 << 16, 27: 1 << 32}  # smallest argument each head width may carry
_FLOAT_FORMS = {25: (2, struct.Struct(">e")), 26: (4, struct.Struct(">f")), 27: (8, struct.Struct(">d"))}
_KIND = {2: "a byte string", 3: "a text string", 4: "an array", 5: "a map"}


class Decoder:
    """The strict decoder with its limits. `steps` counts the work of the last `decode` call
    (one per item head, one per payload byte copied, one per map-key byte compared), whether it
    returned or refused, so tests can check that work stays linear in the input."""

    __slots__ = ("max_bytes", "max_depth", "max_items", "max_string", "steps")

    def __init__(self, *, max_bytes: int = MAX_DECODE_BYTES, max_items: int = MAX_DECODE_ITEMS,
                 max_depth: int = MAX_DEPTH, max_string: int = MAX_STRING_BYTES) -> None:
        for name, v in (("max_bytes", max_bytes), ("max_items", max_items), ("max_depth", max_depth),
                        ("max_string", max_string)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        self.max_bytes, self.max_items, self.max_depth, self.max_string = max_bytes, max_items, max_depth, max_string
        self.steps = 0

    def decode(self, data: bytes) -> Any:
        """Decode canonical CBOR; refuse anything else with a reason."""
        self.steps = 0
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MalformedCBOR(f"expected bytes, got {type(data).__name__}", rule="not-bytes")
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self.max_bytes:
            raise CBORLimitExceeded(f"CBOR document of {size} bytes exceeds the limit of {self.max_bytes}",
                                    rule="too-large", offset=0)
        data = bytes(data)
        if not data:
            raise MalformedCBOR("empty input is not a CBOR item", rule="empty", offset=0)
        return self._run(data)

    def _run(self, data: bytes) -> Any:  # noqa: C901 - one loop on purpose: no recursion, no per-item calls
        n = len(data)
        max_items, max_depth, max_string = self.max_items, self.max_depth, self.max_string
        pos = 0
        items = 0  # items begun
        owed = 0  # items the open containers still promise; each needs at least one byte
        steps = 0
        # Open containers, innermost last: [container, items left, is_map, pending key, previous
        # key's bytes, pending key's offset].
        stack: list[list[Any]] = []
        try:
            while True:
                if pos >= n:
                    raise _truncated(pos, "an item")
                start = pos
                ib = data[pos]
                pos += 1
                steps += 1
                items += 1
                if stack:
                    owed -= 1
                major = ib >> 5
                ai = ib & 0x1F
                if major == 7:
                    if ai == 20:
                        value: Any = False
                    elif ai == 21:
                        value = True
                    elif ai == 22:
                        value = None
                    elif ai in _FLOAT_FORMS:
                        width, form = _FLOAT_FORMS[ai]
                        if pos + width > n:
                            raise _truncated(start, "a float")
                        pos += width
                        value = form.unpack(data[start + 1:pos])[0]
                        if _float(value) != data[start:pos]:
                            raise _noncanonical(start, "float-form", "a float not in its shortest exact form "
                                                "(or a NaN other than 0xf97e00)")
                    elif ai == 31:
                        raise _bad(start, "break", "a break byte (0xff) outside an indefinite-length item")
                    elif ai >= 28:
                        raise _bad(start, "reserved", "reserved additional information (28-30)")
                    else:
                        raise _refused(start, "simple-value", "simple values other than false, true and null "
                                       "are not allowed")
                elif major == 6:
                    raise _refused(start, "tag", "CBOR tags are not allowed (the protocol uses none)")
                else:
                    if ai < 24:
                        arg = ai
                    elif ai == 24:
                        if pos >= n:
                            raise _truncated(start, "an item head")
                        arg = data[pos]
                        pos += 1
                        if arg < 24:
                            raise _noncanonical(start, "head-form", "an argument not in its shortest form")
                    elif ai < 28:
                        width = 1 << (ai - 24)
                        if pos + width > n:
                            raise _truncated(start, "an item head")
                        arg = int.from_bytes(data[pos:pos + width], "big")
                        pos += width
                        if arg < _HEAD_FLOOR[ai]:
                            raise _noncanonical(start, "head-form", "an argument not in its shortest form")
                    elif ai == 31:
                        if major >= 2:
                            raise _noncanonical(start, "indefinite-length",
                                                f"{_KIND[major]} of indefinite length")
                        raise _bad(start, "reserved", "additional information 31 on an integer")
                    else:
                        raise _bad(start, "reserved", "reserved additional information (28-30)")

                    if major == 0:
                        value = arg
                    elif major == 1:
                        value = -1 - arg
                    elif major <= 3:
                        if arg > max_string:
                            raise _limit(start, "string-too-long",
                                         f"{_KIND[major]} longer than the limit of {max_string} bytes")
                        if arg > n - pos:
                            raise _truncated(start, _KIND[major])
                        end = pos + arg
                        value = data[pos:end]
                        steps += arg
                        pos = end
                        if major == 3:
                            try:
                                value = value.decode("utf-8")
                            except UnicodeDecodeError:
                                raise _bad(start, "utf8", "a text string that is not valid UTF-8") from None
                    else:
                        if stack and stack[-1][2] and stack[-1][3] is _NOKEY:
                            raise _refused(start, "container-key", f"{_KIND[major]} as a map key is not allowed")
                        if arg == 0:
                            value = [] if major == 4 else {}
                        else:
                            if len(stack) >= max_depth:
                                raise _limit(start, "too-deep", f"structure nested deeper than {max_depth}")
                            owed += arg if major == 4 else 2 * arg
                            if owed > n - pos:
                                raise _truncated(start, f"{_KIND[major]} whose item count")
                            if items + owed > max_items:
                                raise _limit(start, "too-many-items", f"more than {max_items} items")
                            stack.append([[] if major == 4 else {}, arg, major == 5, _NOKEY, None, 0])
                            continue
                if items > max_items:
                    raise _limit(start, "too-many-items", f"more than {max_items} items")

                # Hand the finished value to its container, closing every container it completes.
                while stack:
                    frame = stack[-1]
                    if frame[2]:
                        if frame[3] is _NOKEY:
                            kb = data[start:pos]
                            prev = frame[4]
                            steps += pos - start
                            if prev is not None and kb <= prev:
                                if kb == prev:
                                    raise _noncanonical(start, "duplicate-key", "a map key repeated")
                                raise _noncanonical(start, "key-order",
                                                    "map keys not in the bytewise order of their encodings")
                            frame[3], frame[4], frame[5] = value, kb, start
                            break
                        d = frame[0]
                        before = len(d)
                        d[frame[3]] = value
                        if len(d) == before:
                            # Distinct encodings of equal values (1, 1.0, true): no map we write.
                            raise _noncanonical(frame[5], "duplicate-key", "a map key equal in value to an earlier one")
                        frame[3] = _NOKEY
                    else:
                        frame[0].append(value)
                    frame[1] -= 1
                    if frame[1]:
                        break
                    stack.pop()
                    value = frame[0]
                else:
                    if pos != n:
                        raise _noncanonical(pos, "trailing-bytes", "trailing bytes after the CBOR item")
                    return value
        finally:
            self.steps = steps


def decode(data: bytes, *, max_bytes: int = MAX_DECODE_BYTES, max_items: int = MAX_DECODE_ITEMS,
           max_depth: int = MAX_DEPTH, max_string: int = MAX_STRING_BYTES) -> Any:
    """Decode canonical CBOR within the given limits; refuse anything else with a typed reason."""
    return Decoder(max_bytes=max_bytes, max_items=max_items, max_depth=max_depth,
                   max_string=max_string).decode(data)
