"""Errors of the commitments layer. Each carries a reason a person can act on.

The CBOR refusals also carry a stable `code` (the class's) and a stable `rule` (which check
refused), so callers and metrics can tell refusals apart without parsing messages.
"""

from __future__ import annotations

from typing import ClassVar


class CommitmentError(ValueError):
    """Base class: bad input to a commitment function, with a readable reason."""


class _CBORRefusal(CommitmentError):
    code: ClassVar[str] = "CBORRefused"

    def __init__(self, message: str, *, rule: str = "unspecified", offset: int | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.offset = offset


class NonCanonicalCBOR(_CBORRefusal):
    """CBOR bytes that decode but are not in RFC 8949 core deterministic form."""

    code = "NonCanonicalCBOR"


class MalformedCBOR(_CBORRefusal):
    """Bytes that are not valid CBOR at all, or hold types the protocol does not use."""

    code = "MalformedCBOR"


class CBORLimitExceeded(MalformedCBOR):
    """CBOR that is larger, longer, deeper or holds more items than the decoder was allowed."""

    code = "CBORLimitExceeded"
