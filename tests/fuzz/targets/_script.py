"""A small byte framing that the block targets read their blocks from, front to back, and that
their seed generators write: mutations of a seed stay mostly well framed."""

from __future__ import annotations


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def more(self) -> bool:
        return self.pos < len(self.data)

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.byte() << 8 | self.byte()

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def blob(self) -> bytes:
        return self.take(self.u16())


class Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def byte(self, v: int) -> Writer:
        self.out.append(v & 0xFF)
        return self

    def blob(self, b: bytes) -> Writer:
        self.out += len(b).to_bytes(2, "big") + b
        return self

    def bytes(self) -> bytes:
        return bytes(self.out)
