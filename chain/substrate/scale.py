"""The few SCALE and account-id codecs the transports need beside substrate-interface: compact
integers (read from and written to exact bytes), hex, BLAKE2-256 and 32-byte account ids."""

from __future__ import annotations

import hashlib
from typing import Any

from scalecodec.utils.ss58 import ss58_decode


def blake2_256(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def compact(n: int) -> bytes:
    """SCALE compact encoding of a non-negative integer."""
    if n < 1 << 6:
        return bytes([n << 2])
    if n < 1 << 14:
        return ((n << 2) | 1).to_bytes(2, "little")
    if n < 1 << 30:
        return ((n << 2) | 2).to_bytes(4, "little")
    body = n.to_bytes((n.bit_length() + 7) // 8, "little")
    return bytes([((len(body) - 4) << 2) | 3]) + body


def hex_bytes(value: str) -> bytes:
    if not isinstance(value, str):  # a node's JSON may carry anything; callers catch ValueError
        raise ValueError(f"expected a hex string, got {type(value).__name__}")
    return bytes.fromhex(value[2:] if value.startswith("0x") else value)


def read_compact(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the SCALE compact integer at `pos`."""
    mode = data[pos] & 3
    if mode == 0:
        return data[pos] >> 2, pos + 1
    if mode == 1:
        return int.from_bytes(data[pos : pos + 2], "little") >> 2, pos + 2
    if mode == 2:
        return int.from_bytes(data[pos : pos + 4], "little") >> 2, pos + 4
    n = (data[pos] >> 2) + 4
    return int.from_bytes(data[pos + 1 : pos + 1 + n], "little"), pos + 1 + n


def pubkey(address: Any) -> bytes:
    """The 32-byte account id of an SS58 address, a 0x hex id, or a {'Id': ...} MultiAddress."""
    if isinstance(address, dict) and "Id" in address:
        address = address["Id"]
    if isinstance(address, (list, tuple)) and len(address) == 2 and address[0] == "Id":
        address = address[1]
    if not isinstance(address, str):
        raise ValueError(f"unsupported address form {type(address).__name__}")
    if address.startswith("0x"):
        key = hex_bytes(address)
    else:
        key = bytes.fromhex(ss58_decode(address))
    if len(key) != 32:
        raise ValueError("account id is not 32 bytes")
    return key
