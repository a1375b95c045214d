"""miner.recipe.load_recipe (a run document anyone may hand a verifier): a Recipe, or RecipeRefused.

First byte even: the rest is a whole document. Odd: the rest is a body, which the harness wraps
with its digest and a signature of a fixed key, so that mutations get past the signature check
and reach the body's checks.
"""

from __future__ import annotations

from nacl.signing import SigningKey

from commitments import cbor
from commitments.hashing import h
from miner.recipe import RECIPE_VERSION, RecipeRefused, load_recipe

_KEY = SigningKey(bytes(range(32)))


def sign(body: bytes) -> bytes:
    # digest(RECIPE_VERSION, body) for a canonical body, computed from its bytes (nothing decoded).
    d = h(b"\x82" + cbor.encode(RECIPE_VERSION) + body)
    return cbor.encode({"body": body, "digest": d, "public_key": bytes(_KEY.verify_key),
                        "signature": _KEY.sign(d).signature})


def TestOneInput(data: bytes) -> None:
    doc = sign(data[1:]) if data[:1] and data[0] & 1 else data[1:]
    try:
        recipe = load_recipe(doc)
    except RecipeRefused:
        return
    recipe.promises  # noqa: B018


def seeds() -> dict[str, bytes]:
    import tempfile
    from pathlib import Path

    from commitments.dataset import Dataset
    from commitments.spec import Spec
    from miner.recipe import write_recipe
    from tests.fuzz.targets._opening import SPEC
    from tests.miner.helpers import corpus

    spec = Spec.from_dict(SPEC)
    with tempfile.TemporaryDirectory() as tmp:
        doc = write_recipe(spec, Dataset.open(corpus(Path(tmp)), spec.sample_len), 2, signing_key=_KEY)
    body = cbor.decode(doc)["body"]
    return {"document": b"\0" + doc, "body": b"\1" + body}
