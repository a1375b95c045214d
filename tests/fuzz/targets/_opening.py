"""The honest opening the opening targets start from: a tiny MLP run's step 2, kept as a seed of
`opening_file`, and the chain facts it answers (read from its own manifest)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

BASE = Path(__file__).resolve().parents[1] / "corpus" / "opening_file" / "valid-step2"
SPEC = {"steps": 2, "model": {"kind": "mlp", "block_size": 4, "n_embd": 2, "hidden": [2]},
        "batch": {"batch_size": 2, "seq_len": 4}, "rng": {"seed": 7, "schedule_seed": 11}}


def build() -> bytes:
    """Train the two steps and build the opening of step 2 (seed generation only: a few seconds)."""
    import tempfile

    from challenges.opening import build_opening
    from commitments.spec import Spec
    from tests.miner.helpers import RUN_ID, corpus, walk

    spec = Spec.from_dict(SPEC)
    with tempfile.TemporaryDirectory() as tmp:
        w = walk(spec, corpus(Path(tmp)))
        return build_opening(spec=spec, run_id=RUN_ID, step=2, pre_state=w.states[1], dataset=w.dataset,
                             schedule=w.schedule, leaves=w.leaves)


@functools.cache
def base() -> tuple[bytes, dict[str, Any]]:
    """(the opening's bytes, the validate_opening facts it passes, less expected_digest)."""
    from challenges.opening import load_opening
    from commitments.spec import Spec

    data = BASE.read_bytes() if BASE.exists() else build()
    m = load_opening(data).manifest
    facts = dict(run_id=m["run_id"], step=m["step"], spec_digest=Spec.from_cbor(m["spec"]).digest(),
                 dataset_hash=m["dataset_hash"], schedule_commitment=m["schedule_commitment"],
                 initial_hash=bytes(32), root=m["root"], size=m["size"])
    return data, facts


def check(data: bytes, *, path: Path | None = None) -> None:
    """load + validate as the node's stage_validate does; only OpeningRefused may come out."""
    from challenges.opening import OpeningRefused, load_opening, validate_opening

    original, facts = base()
    try:
        op = load_opening(path if path is not None else data, max_bytes=len(original) * 4)
        # The opening's own digest stands in for the chain's: the checks behind it are the prize.
        validate_opening(op, expected_digest=op.digest, **facts)
    except OpeningRefused as exc:
        if not exc.reason:
            raise AssertionError("a refusal must say why") from exc
        return
    if data != original and not _only_tree_size_differs(op, original):
        raise AssertionError("an opening that differs from the honest one was accepted")


def _only_tree_size_differs(op: Any, original: bytes) -> bool:
    """The accepted opening is the honest one but for `num_samples`, the size of the tree its
    sample proofs are checked against. The dataset hash is the tree's root and does not commit to
    its size, and an RFC 9162 inclusion proof verifies under every size that gives its path the
    same shape: such a size proves the same samples at the same indices and changes no byte
    that is checked (docs/limits.md). On chain the opening digest binds the miner's own choice."""
    from challenges.opening import load_opening

    honest = load_opening(original)
    mine = {k: v for k, v in op.manifest.items() if k != "num_samples"}
    theirs = {k: v for k, v in honest.manifest.items() if k != "num_samples"}
    return mine == theirs and bytes(op.pre_state) == bytes(honest.pre_state)
