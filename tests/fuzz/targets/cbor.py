"""commitments.cbor.decode on arbitrary bytes: a value that encodes back to the same bytes, or a
CommitmentError (MalformedCBOR / NonCanonicalCBOR). Beside it, cbor.map_entry (the walk that
finds one field without building anything): on a decoded map it finds every text key's value
where decode put it, and on any bytes it answers or refuses with a CommitmentError."""

from __future__ import annotations

from commitments import cbor
from commitments.errors import CommitmentError


def TestOneInput(data: bytes) -> None:
    try:
        walked = cbor.map_entry(data, "a")
    except CommitmentError:
        walked = None
    try:
        obj = cbor.decode(data)
    except CommitmentError:
        return
    if cbor.encode(obj) != data:
        raise AssertionError("a decoded CBOR value does not encode back to its bytes")
    if isinstance(obj, dict):
        where = cbor.map_entry(data, "a")  # a document decode accepts, the walk accepts too
        if ("a" in obj) != (where is not None) or walked != where:
            raise AssertionError("map_entry disagrees with decode about the key 'a'")
        if where is not None and cbor.decode(data[where[0]:where[1]]) != obj["a"]:
            raise AssertionError("map_entry's window does not hold the value decode gave for 'a'")


def seeds() -> dict[str, bytes]:
    values = {
        "int": 23,
        "neg": -(2**63),
        "u64": 2**64 - 1,
        "float": 1.5,
        "text": "pot/step/v1",
        "bytes": b"\0" * 33,
        "list": [1, [2, [3, None, True, False]]],
        "map": {"a": 1, "bb": {"c": b"x"}, "": []},
        "leaf": ["pot/step/v1", 3, b"\1" * 32, 0x3F800000],
    }
    return {k: cbor.encode(v) for k, v in values.items()}
