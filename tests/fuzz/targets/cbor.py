"""commitments.cbor.decode on arbitrary bytes: a value that encodes back to the same bytes, or a
CommitmentError (MalformedCBOR / NonCanonicalCBOR)."""

from __future__ import annotations

from commitments import cbor
from commitments.errors import CommitmentError


def TestOneInput(data: bytes) -> None:
    try:
        obj = cbor.decode(data)
    except CommitmentError:
        return
    if cbor.encode(obj) != data:
        raise AssertionError("a decoded CBOR value does not encode back to its bytes")


def seeds() -> dict[str, bytes]:
    values = {
        "int": 23, "neg": -(2**63), "u64": 2**64 - 1, "float": 1.5, "text": "pot/step/v1", "bytes": b"\0" * 33,
        "list": [1, [2, [3, None, True, False]]], "map": {"a": 1, "bb": {"c": b"x"}, "": []},
        "leaf": ["pot/step/v1", 3, b"\1" * 32, 0x3F800000],
    }
    return {k: cbor.encode(v) for k, v in values.items()}
