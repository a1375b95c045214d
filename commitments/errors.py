"""Errors of the commitments layer. Each carries a reason a person can act on."""


class CommitmentError(ValueError):
    """Base class: bad input to a commitment function, with a readable reason."""


class NonCanonicalCBOR(CommitmentError):
    """CBOR bytes that decode but are not in RFC 8949 core deterministic form."""


class MalformedCBOR(CommitmentError):
    """Bytes that are not valid CBOR at all, or hold types the protocol does not use."""
