"""BLAKE3-256 digests with domain separation.

Every hashed structure is the deterministic CBOR array `[domain, *fields]`; the domain is a
versioned string such as "pot/step/v1", so two kinds of structure can never share a digest.
"""

from __future__ import annotations

from typing import Any

import blake3 as _blake3

from commitments import cbor

DIGEST_SIZE = 32


def blake3(data: bytes = b"") -> _blake3.blake3:
    """hashlib-style constructor (the default `hash=` of the Merkle functions)."""
    return _blake3.blake3(data)


def h(data: bytes) -> bytes:
    """Plain BLAKE3-256 of raw bytes."""
    return _blake3.blake3(data).digest()


def structure_bytes(domain: str, *fields: Any) -> bytes:
    """The canonical bytes of a domain-separated structure."""
    if not isinstance(domain, str) or not domain.startswith("pot/"):
        raise ValueError(f"domain must be a 'pot/...' string, got {domain!r}")
    return cbor.encode([domain, *fields])


def digest(domain: str, *fields: Any) -> bytes:
    """BLAKE3-256 of `CBOR([domain, *fields])`."""
    return h(structure_bytes(domain, *fields))
