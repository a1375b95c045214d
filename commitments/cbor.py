"""Deterministic CBOR (RFC 8949 §4.2.1 core deterministic encoding) for every hashed structure.

The encoder is ours so the bytes never depend on a library's defaults. The decoder is ours too,
and it is the one parser for every CBOR input that arrives from outside (remarks, manifests, leaf
lists, specs, snapshots, recipes): one pass, no recursion, no tags, and it accepts only the one
canonical encoding our encoder writes. Anything else is refused with a typed error
(`MalformedCBOR`, `NonCanonicalCBOR`, `CBORLimitExceeded`) naming the offset and the rule broken.
Work is linear in the input: a claimed length or item count is checked against the bytes that
remain before anything is built, and no message ever formats a value taken from the input.
Memory is bounded by bytes, not items: the decoder charges what each Python object it builds
costs, before building it, against a budget of `memory_budget(len(input))` (four times the input
plus a small fixed allowance, at most `MAX_DECODE_MEMORY`), and refuses with `CBORLimitExceeded`
(rule `too-much-memory`) as soon as the next object would not fit. `decode_byte_strings` reads
an array of byte strings into one compact `ByteStrings` (the document's bytes and an offsets
array) instead of one object per item.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

from commitments.errors import CBORLimitExceeded, MalformedCBOR, NonCanonicalCBOR

MAX_DEPTH = 64
MAX_DECODE_BYTES = 256 * 1024 * 1024
# Every item costs a Python object; the cap keeps a document of tiny items (b"\x80" * n) from
# costing tens of bytes of memory per input byte. A leaf list of 512 MiB holds far fewer items.
MAX_DECODE_ITEMS = 1 << 24
MAX_STRING_BYTES = MAX_DECODE_BYTES

# The memory budget: the decoded objects of a document of n bytes may take MEMORY_RATIO * n bytes,
# plus MEMORY_SLACK (the fixed cost of small documents, and nesting at full depth: 64 nested
# one-entry maps are charged 26 KiB), and never more than MAX_DECODE_MEMORY. A caller whose honest
# documents need more (or that wants less) passes max_memory.
MEMORY_RATIO = 4
MEMORY_SLACK = 32 * 1024
MAX_DECODE_MEMORY = 1 << 30

# What each decoded object costs, charged before it is built. Measured on CPython 3.11 (64-bit):
# sys.getsizeof for the object, tracemalloc for what building it allocates (peak included), each
# rounded up to pymalloc's 16-byte blocks so that the charge also covers the allocator's rounding.
#   sys.getsizeof([]) == 56 (GC header included); a list sized at its head holds 8 bytes a slot:
#   tracemalloc, 10^5 lists of k preallocated slots: 56 + 8k each.
_LIST = 56
_SLOT = 8
#   sys.getsizeof({}) == 64. Filling a dict allocates its key table as it grows: tracemalloc, 2000
#   dicts of k int keys: 224 bytes each for k = 1..5, 349 for 6..10, then 54 bytes an entry; one
#   dict of 87,382 entries peaks at 90 bytes an entry, while a resize holds the old and new tables.
#   Charged: 64 + 96 * max(k, 2) (the key and value objects are items of their own).
_MAP = 64
_ENTRY = 96
#   sys.getsizeof(b"") == 33: a byte string of n bytes costs 33 + n (the empty and the one-byte
#   strings are shared, and are charged anyway).
_BYTES = 33
#   sys.getsizeof("") == 49 for ASCII text: 49 + n. Other text costs up to 80 + 4n (one 4-byte
#   character makes every character 4 bytes wide: 300,064 + 100,000 bytes for "a" * 99,996 + an
#   emoji), and decoding it peaks at 6n while CPython widens its buffer (tracemalloc, mixed 1-, 2-
#   and 4-byte characters: 6.0n), beside the n-byte copy of the UTF-8.
_ASCII = 49
_TEXT = 80
_TEXT_WIDEN = 6
#   Integers 0..256 and -5..-1 are shared: nothing. sys.getsizeof(2**30 - 1) == 28,
#   sys.getsizeof(2**30) == 32, sys.getsizeof(2**64 - 1) == 36.
_SMALL_INT = 32
_BIG_INT = 48
#   sys.getsizeof(1.5) == 24. false, true and null are shared: nothing.
_FLOAT = 32
#   The decoder's frame for an open container: a six-slot list, sys.getsizeof == 104.
_FRAME = 112


def _r16(n: int) -> int:
    return (n + 15) & -16


def memory_budget(size: int, ratio: int = MEMORY_RATIO) -> int:
    """The memory the objects decoded from a document of `size` bytes may take: by default four
    times the input (a caller whose honest documents cost more passes its own `ratio`), plus
    MEMORY_SLACK, at most MAX_DECODE_MEMORY."""
    return min(ratio * size + MEMORY_SLACK, MAX_DECODE_MEMORY)


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
_ANY_KIND = {0: "an integer", 1: "an integer", 6: "a tag", 7: "a float or simple value", **_KIND}


def _long_arg(data: bytes, start: int, major: int, ai: int, n: int) -> tuple[int, int]:
    """The argument of the head at `start` (major type 0-5) whose additional information `ai` is 24
    or more, and the offset after the head; refuses a truncated, non-shortest, indefinite-length or
    reserved head with the decoder's rules."""
    pos = start + 1
    if ai == 24:
        if pos >= n:
            raise _truncated(start, "an item head")
        arg = data[pos]
        if arg < 24:
            raise _noncanonical(start, "head-form", "an argument not in its shortest form")
        return arg, pos + 1
    if ai < 28:
        width = 1 << (ai - 24)
        if pos + width > n:
            raise _truncated(start, "an item head")
        arg = int.from_bytes(data[pos:pos + width], "big")
        if arg < _HEAD_FLOOR[ai]:
            raise _noncanonical(start, "head-form", "an argument not in its shortest form")
        return arg, pos + width
    if ai == 31:
        if major >= 2:
            raise _noncanonical(start, "indefinite-length", f"{_KIND[major]} of indefinite length")
        raise _bad(start, "reserved", "additional information 31 on an integer")
    raise _bad(start, "reserved", "reserved additional information (28-30)")


def _window(data: Any, start: int, end: int | None, what: str) -> int:
    """The end of the window data[start:end] that `what` reads in place, checked: bytes only, and
    0 <= start <= end <= len(data)."""
    if not isinstance(data, bytes):
        raise MalformedCBOR(f"{what} needs bytes, got {type(data).__name__}", rule="not-bytes")
    end = len(data) if end is None else end
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= len(data)):
        raise ValueError(f"the window {start!r}:{end!r} is not inside the {len(data)} bytes given")
    return end


def _too_much_memory(offset: int, budget: int) -> CBORLimitExceeded:
    return _limit(
        offset, "too-much-memory", f"decoding it would take more than the memory limit of {budget} bytes"
    )


def _check_limits(**limits: Any) -> None:
    for name, v in limits.items():
        if v is None and name == "max_memory":
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(
                f"{name} must be a non-negative integer" + (" or None" if name == "max_memory" else "")
            )


def _document(data: Any, max_bytes: int) -> tuple[bytes, int]:
    """The input as bytes within `max_bytes`, and what a copy of it cost (0 for bytes)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise MalformedCBOR(f"expected bytes, got {type(data).__name__}", rule="not-bytes")
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if size > max_bytes:
        raise CBORLimitExceeded(f"CBOR document of {size} bytes exceeds the limit of {max_bytes}",
                                rule="too-large", offset=0)
    copied = 0 if isinstance(data, bytes) else _r16(_BYTES + size)
    data = bytes(data)
    if not data:
        raise MalformedCBOR("empty input is not a CBOR item", rule="empty", offset=0)
    return data, copied


class Decoder:
    """The strict decoder with its limits. `steps` counts the work of the last `decode` call
    (one per item head, one per payload byte copied, one per map-key byte compared), whether it
    returned or refused, so tests can check that work stays linear in the input; `memory` is what
    it charged for the objects it built (the peak, for a refusal)."""

    __slots__ = ("max_bytes", "max_depth", "max_items", "max_memory", "max_string", "memory", "steps")

    def __init__(self, *, max_bytes: int = MAX_DECODE_BYTES, max_items: int = MAX_DECODE_ITEMS,
                 max_depth: int = MAX_DEPTH, max_string: int = MAX_STRING_BYTES,
                 max_memory: int | None = None) -> None:
        _check_limits(max_bytes=max_bytes, max_items=max_items, max_depth=max_depth, max_string=max_string,
                      max_memory=max_memory)
        self.max_bytes, self.max_items, self.max_depth, self.max_string = (
            max_bytes,
            max_items,
            max_depth,
            max_string,
        )
        self.max_memory = max_memory
        self.steps = 0
        self.memory = 0

    def budget(self, size: int) -> int:
        """The memory the objects decoded from `size` bytes may take: `max_memory` when given,
        else `memory_budget(size)`."""
        return memory_budget(size) if self.max_memory is None else self.max_memory

    def decode(self, data: bytes, *, start: int = 0, end: int | None = None) -> Any:
        """Decode canonical CBOR; refuse anything else with a reason. With `start`/`end`, the
        document is data[start:end], read in place (no copy of a `bytes` input); offsets in
        refusals then count from the start of `data`."""
        self.steps = self.memory = 0
        if start or end is not None:
            end = _window(data, start, end, "a window")
            if end - start > self.max_bytes:
                raise CBORLimitExceeded(f"CBOR document of {end - start} bytes exceeds the limit of "
                                        f"{self.max_bytes}", rule="too-large", offset=start)
            if start == end:
                raise MalformedCBOR("empty input is not a CBOR item", rule="empty", offset=start)
            return self._run(data, 0, self.budget(end - start), start, end)
        data, copied = _document(data, self.max_bytes)
        budget = self.budget(len(data))
        if copied > budget:
            raise _too_much_memory(0, budget)
        return self._run(data, copied, budget, 0, len(data))

    def _run(self, data: bytes, used: int, budget: int, pos: int, n: int) -> Any:  # noqa: C901 - one loop, no recursion
        max_items, max_depth, max_string = self.max_items, self.max_depth, self.max_string
        items = 0  # items begun
        owed = 0  # items the open containers still promise; each needs at least one byte
        steps = 0
        # `used` is what the objects built so far cost (charged before each is built), `budget` its limit.
        # Open containers, innermost last: [container, items left, is_map, pending key (a map) or next
        # slot (an array), previous key's bytes, pending key's offset].
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
                        used += _FLOAT
                        if used > budget:
                            raise _too_much_memory(start, budget)
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
                    else:
                        arg, pos = _long_arg(data, start, major, ai, n)

                    if major == 0:
                        value = arg
                        if arg > 256:
                            used += _SMALL_INT if arg < 1 << 30 else _BIG_INT
                    elif major == 1:
                        value = -1 - arg
                        if arg > 4:
                            used += _SMALL_INT if arg < 1 << 30 else _BIG_INT
                    elif major <= 3:
                        if arg > max_string:
                            raise _limit(start, "string-too-long",
                                         f"{_KIND[major]} longer than the limit of {max_string} bytes")
                        if arg > n - pos:
                            raise _truncated(start, _KIND[major])
                        end = pos + arg
                        cost = _r16(_BYTES + arg)
                        if used + cost > budget:
                            raise _too_much_memory(start, budget)
                        value = data[pos:end]
                        steps += arg
                        pos = end
                        if major == 2:
                            used += cost
                        else:
                            if value.isascii():
                                text = _r16(_ASCII + arg)
                                peak = text
                            else:
                                text = _r16(_TEXT + 4 * arg)
                                peak = _r16(_TEXT + _TEXT_WIDEN * arg)
                            # The UTF-8 copy is alive while the text is built, then dropped.
                            if used + cost + peak > budget:
                                raise _too_much_memory(start, budget)
                            used += text
                            try:
                                value = value.decode("utf-8")
                            except UnicodeDecodeError:
                                raise _bad(start, "utf8", "a text string that is not valid UTF-8") from None
                    else:
                        if stack and stack[-1][2] and stack[-1][3] is _NOKEY:
                            raise _refused(
                                start, "container-key", f"{_KIND[major]} as a map key is not allowed"
                            )
                        if arg == 0:
                            used += _r16(_LIST) if major == 4 else _MAP
                            if used > budget:
                                raise _too_much_memory(start, budget)
                            value = [] if major == 4 else {}
                        else:
                            if len(stack) >= max_depth:
                                raise _limit(start, "too-deep", f"structure nested deeper than {max_depth}")
                            owed += arg if major == 4 else 2 * arg
                            if owed > n - pos:
                                raise _truncated(start, f"{_KIND[major]} whose item count")
                            if items + owed > max_items:
                                raise _limit(start, "too-many-items", f"more than {max_items} items")
                            # The whole container is charged at its head: an array's slots are
                            # allocated there, a map's table as it fills.
                            used += _FRAME + (_r16(_LIST + _SLOT * arg) if major == 4 else
                                              _MAP + _ENTRY * max(arg, 2))
                            if used > budget:
                                raise _too_much_memory(start, budget)
                            if major == 4:
                                stack.append([[None] * arg, arg, False, 0, None, 0])
                            else:
                                stack.append([{}, arg, True, _NOKEY, None, 0])
                            continue
                if items > max_items:
                    raise _limit(start, "too-many-items", f"more than {max_items} items")
                if used > budget:
                    raise _too_much_memory(start, budget)

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
                            # The key's encoding is kept until the next key: charged while it is.
                            held = _r16(_BYTES + pos - start)
                            used += held - (0 if prev is None else _r16(_BYTES + len(prev)))
                            if used > budget:
                                raise _too_much_memory(start, budget)
                            frame[3], frame[4], frame[5] = value, kb, start
                            break
                        d = frame[0]
                        before = len(d)
                        d[frame[3]] = value
                        if len(d) == before:
                            # Distinct encodings of equal values (1, 1.0, true): no map we write.
                            raise _noncanonical(
                                frame[5], "duplicate-key", "a map key equal in value to an earlier one"
                            )
                        frame[3] = _NOKEY
                    else:
                        frame[0][frame[3]] = value
                        frame[3] += 1
                    frame[1] -= 1
                    if frame[1]:
                        break
                    stack.pop()
                    used -= _FRAME + (0 if frame[4] is None else _r16(_BYTES + len(frame[4])))
                    value = frame[0]
                else:
                    if pos != n:
                        raise _noncanonical(pos, "trailing-bytes", "trailing bytes after the CBOR item")
                    return value
        finally:
            self.steps = steps
            self.memory = used


def decode(data: bytes, *, max_bytes: int = MAX_DECODE_BYTES, max_items: int = MAX_DECODE_ITEMS,
           max_depth: int = MAX_DEPTH, max_string: int = MAX_STRING_BYTES, max_memory: int | None = None,
           start: int = 0, end: int | None = None) -> Any:
    """Decode canonical CBOR within the given limits; refuse anything else with a typed reason.
    The decoded objects may take `max_memory` bytes (default: `memory_budget` of the document's
    size); `start`/`end` decode data[start:end] in place (Decoder.decode)."""
    return Decoder(max_bytes=max_bytes, max_items=max_items, max_depth=max_depth, max_string=max_string,
                   max_memory=max_memory).decode(data, start=start, end=end)


# --- one entry of a top-level map, found without building anything --------------------------------


def map_entry(data: bytes, key: str, *, start: int = 0, end: int | None = None) -> tuple[int, int] | None:
    """Where the value of text key `key` lies in the top-level map data[start:end]: its (start, end)
    offsets, or None when the map has no such key. Nothing is built: the walk keeps one count of
    the items still owed, so it takes constant memory and time linear in the bytes walked, and
    any document it does not refuse must still pass `decode` (this walk checks heads, lengths,
    tags and reserved values, not canonical form). A caller uses it to read one small field (a
    manifest's spec) that sizes the budget of the whole document's decode."""
    n = _window(data, start, end, "a map walk")
    pos = start
    if pos >= n:
        raise MalformedCBOR("empty input is not a CBOR item", rule="empty", offset=pos)
    ib = data[pos]
    if ib >> 5 != 5:
        raise MalformedCBOR(f"the document is {_ANY_KIND[ib >> 5]}, not a map", rule="not-a-map", offset=pos)
    entries, pos = (ib & 0x1F, pos + 1) if ib & 0x1F < 24 else _long_arg(data, pos, 5, ib & 0x1F, n)
    if 2 * entries > n - pos:
        raise _truncated(start, "a map whose item count")
    wanted = key.encode("utf-8")
    for _ in range(entries):
        kstart = pos
        pos = _skip_item(data, pos, n)
        kb = data[kstart:pos]
        vstart = pos
        pos = _skip_item(data, pos, n)
        ib = kb[0]
        if ib >> 5 == 3:
            arg_at = 1 if ib & 0x1F < 24 else 1 + (1 << ((ib & 0x1F) - 24))
            if kb[arg_at:] == wanted:
                return vstart, pos
    if pos != n:
        raise _noncanonical(pos, "trailing-bytes", "trailing bytes after the CBOR item")
    return None


def _skip_item(data: bytes, pos: int, n: int) -> int:
    """The offset after the item at `pos` (and everything inside it), building nothing."""
    owed = 1
    while owed:
        if pos >= n:
            raise _truncated(pos, "an item")
        start = pos
        ib = data[pos]
        pos += 1
        owed -= 1
        major, ai = ib >> 5, ib & 0x1F
        if major == 7:
            if ai in _FLOAT_FORMS:
                pos += _FLOAT_FORMS[ai][0]
                if pos > n:
                    raise _truncated(start, "a float")
            elif ai == 31:
                raise _bad(start, "break", "a break byte (0xff) outside an indefinite-length item")
            elif ai >= 28:
                raise _bad(start, "reserved", "reserved additional information (28-30)")
            continue
        if major == 6:
            raise _refused(start, "tag", "CBOR tags are not allowed (the protocol uses none)")
        arg, pos = (ai, pos) if ai < 24 else _long_arg(data, start, major, ai, n)
        if major in (2, 3):
            if arg > n - pos:
                raise _truncated(start, _KIND[major])
            pos += arg
        elif major >= 4:
            owed += arg if major == 4 else 2 * arg
            if owed > n - pos:
                raise _truncated(start, f"{_KIND[major]} whose item count")
    return pos


# --- what the decoder charges, for callers that size a budget from a document's known shape -------


def charge_bytes(n: int) -> int:
    """What `decode` charges for a byte string of `n` bytes."""
    return _r16(_BYTES + n)


def charge_text(n: int) -> int:
    """The most `decode` charges for an ASCII text string of `n` bytes once it is built."""
    return _r16(_ASCII + n)


def charge_array(items: int) -> int:
    """What `decode` charges for an array of `items` items (its slots and its open frame), not
    counting the items themselves."""
    return _FRAME + _r16(_LIST + _SLOT * items) if items else _r16(_LIST)


def charge_map(entries: int) -> int:
    """What `decode` charges for a map of `entries` entries, not counting its keys and values."""
    return _FRAME + _MAP + _ENTRY * max(entries, 2) if entries else _MAP


CHARGE_INT = _BIG_INT  # the most `decode` charges for an integer


# --- an array of byte strings, compact -----------------------------------------------------------

_HEAD_LEN = bytes(1 if ai < 24 else 1 + (1 << (ai - 24)) if ai < 28 else 1 for ai in range(32))
# ByteStrings keeps the head offset of every _STRIDE-th item and walks the (already checked) heads
# from there: 4 bytes of offsets per _STRIDE items, so even a list of one-byte items costs 1/4 of its size.
_STRIDE = 16


def _next_head(data: bytes, at: int) -> tuple[int, int]:
    """(payload start, payload end) of the checked byte-string head at `at`."""
    ai = data[at] & 0x1F
    if ai < 24:
        return at + 1, at + 1 + ai
    begin = at + _HEAD_LEN[ai]
    return begin, begin + int.from_bytes(data[at + 1:begin], "big")


class ByteStrings(Sequence[bytes]):
    """A decoded CBOR array of byte strings, read-only: the document's bytes and the offset of every
    16th item's head (4 bytes each; 8 past 4 GiB), not one Python object per item. Items are
    sliced out as they are read (iteration walks the heads; indexing walks at most 15 from the
    nearest kept offset); a slice with step 1 is a view that shares the buffer."""

    __slots__ = ("_data", "_marks", "_lo", "_hi")

    def __init__(self, data: bytes, marks: array, count: int, lo: int = 0, hi: int | None = None) -> None:
        # marks[k] is where item k * _STRIDE's head starts (the document's end for k * _STRIDE == count).
        self._data, self._marks = data, marks
        self._lo, self._hi = lo, count if hi is None else hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def _head(self, i: int) -> int:
        data = self._data
        at = self._marks[i // _STRIDE]
        for _ in range(i % _STRIDE):
            at = _next_head(data, at)[1]
        return at

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step == 1:
                return ByteStrings(self._data, self._marks, 0, self._lo + lo, self._lo + max(lo, hi))
            return [self[i] for i in range(lo, hi, step)]
        i = index.__index__()
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("ByteStrings index out of range")
        begin, end = _next_head(self._data, self._head(self._lo + i))
        return self._data[begin:end]

    def __iter__(self) -> Iterator[bytes]:
        if self._lo >= self._hi:
            return
        data, lens = self._data, _HEAD_LEN
        at = self._head(self._lo)
        for _ in range(self._hi - self._lo):
            ai = data[at] & 0x1F
            if ai < 24:
                begin, at = at + 1, at + 1 + ai
            else:
                begin = at + lens[ai]
                at = begin + int.from_bytes(data[at + 1:begin], "big")
            yield data[begin:at]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (ByteStrings, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ByteStrings({len(self)} items)"

    @property
    def nbytes(self) -> int:
        """The memory this holds beyond the document's bytes: its offsets array."""
        return self._marks.itemsize * len(self._marks)


def _foreign(start: int, ib: int, where: str) -> MalformedCBOR:
    """The refusal of an item of the wrong type at `start`: a byte that no CBOR item may start with
    (a break, reserved additional information) or a tag gets the decoder's own reason."""
    major, ai = ib >> 5, ib & 0x1F
    if major == 6:
        return _refused(start, "tag", "CBOR tags are not allowed (the protocol uses none)")
    if major == 7 and ai == 31:
        return _bad(start, "break", "a break byte (0xff) outside an indefinite-length item")
    if 28 <= ai <= 30 or (ai == 31 and major < 2):
        return _bad(start, "reserved", "reserved additional information")
    return _refused(start, "item-type", f"{_ANY_KIND[major]} {where}")


def decode_byte_strings(data: bytes, *, max_bytes: int = MAX_DECODE_BYTES, max_items: int = MAX_DECODE_ITEMS,
                        max_string: int = MAX_STRING_BYTES) -> ByteStrings:
    """Decode a canonical CBOR array of byte strings into a compact `ByteStrings`, with the rules
    and refusals of `decode`; an item of any other type is refused at its first byte (rule
    `item-type`). Memory: the offsets array, 4 bytes per 16 items (an item is at least one byte),
    and a copy of the input unless it is `bytes`."""
    _check_limits(max_bytes=max_bytes, max_items=max_items, max_string=max_string)
    data, _ = _document(data, max_bytes)
    n = len(data)
    ib = data[0]
    major, ai = ib >> 5, ib & 0x1F
    if major != 4:
        raise _foreign(0, ib, "where an array of byte strings is due")
    count, pos = (ai, 1) if ai < 24 else _long_arg(data, 0, 4, ai, n)
    if count > n - pos:
        raise _truncated(0, "an array whose item count")
    if count + 1 > max_items:
        raise _limit(0, "too-many-items", f"more than {max_items} items")
    marks = array("I" if n < 1 << 32 else "Q")  # grows as items are read: nothing for what is refused
    for i in range(count):
        if pos >= n:
            raise _truncated(pos, "an item")
        start = pos
        ib = data[pos]
        if ib >> 5 != 2:
            raise _foreign(start, ib, "in an array that holds only byte strings")
        ai = ib & 0x1F
        if ai < 24:
            length, pos = ai, pos + 1
        else:
            length, pos = _long_arg(data, start, 2, ai, n)
        if length > max_string:
            raise _limit(
                start, "string-too-long", f"a byte string longer than the limit of {max_string} bytes"
            )
        if length > n - pos:
            raise _truncated(start, "a byte string")
        if not i % _STRIDE:
            marks.append(start)
        pos += length
    if not count % _STRIDE:
        marks.append(pos)
    if pos != n:
        raise _noncanonical(pos, "trailing-bytes", "trailing bytes after the CBOR item")
    return ByteStrings(data, marks, count)
