"""commitments.spec.Spec.from_cbor on arbitrary bytes (the spec inside a registration or an
opening): a Spec, or CommitmentError (SpecError, MalformedCBOR, NonCanonicalCBOR)."""

from __future__ import annotations

from commitments.errors import CommitmentError
from commitments.spec import Spec


def TestOneInput(data: bytes) -> None:
    try:
        spec = Spec.from_cbor(data)
    except CommitmentError:
        return
    Spec.from_cbor(spec.to_cbor())  # what it canonicalises to is a spec too
    spec.digest()


def seeds() -> dict[str, bytes]:
    from tests.miner.helpers import tiny_spec

    return {"default": Spec.from_dict({}).to_cbor(), "mlp": tiny_spec(3).to_cbor(),
            "gpt": tiny_spec(2, kind="gpt").to_cbor(),
            "cuda": Spec.from_dict({"profile": "torch-native",
                                    "hardware": {"device": "cuda", "isa": "sm90", "threads": 1}}).to_cbor()}
