"""Checkpoint store: keep 1 state in 10, delete the rest, regenerate every one exactly."""

from __future__ import annotations

import pytest

from commitments.dataset import Dataset
from commitments.leaves import step_leaf
from miner.checkpoints import LEAVES_MAGIC, CheckpointError, CheckpointStore
from miner.trainer import Trainer
from tests.miner.helpers import corpus, tiny_spec

STEPS = 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    spec = tiny_spec(STEPS)
    ds = Dataset.open(corpus(base), spec.sample_len)
    tr = Trainer(spec, ds, base / "run", None, keep_every=1, progress=False)
    tr.prepare()
    tr.train()
    tr.close()
    return spec, ds, tr, base / "run"


def test_regenerate_every_deleted_state(trained):
    spec, ds, tr, run_dir = trained
    digests = {t: tr.store.state(t).digest() for t in (5, 15)}
    store = CheckpointStore(run_dir, keep_every=10, spec=spec, batch_fn=tr.batch)
    assert len(store) == STEPS + 1
    gone = store.prune()
    assert gone == [t for t in range(1, STEPS) if t % 10]
    assert store.kept_steps() == [0, 10, 20]
    leaves = store.parsed_leaves
    for t in range(STEPS + 1):
        assert store.state(t).digest() == leaves[t].state_digest, t
    assert store.state(5).digest() == digests[5] and store.state(15).digest() == digests[15]
    # Out of order too (no cache to lean on): from the nearest kept state before it.
    fresh = CheckpointStore(run_dir, keep_every=10, spec=spec, batch_fn=tr.batch)
    assert fresh.state(13).digest() == leaves[13].state_digest
    assert fresh.state(7).digest() == leaves[7].state_digest


def test_regeneration_refuses_a_different_history(trained):
    spec, ds, tr, run_dir = trained
    # Replaying other batches than the ones trained on cannot reproduce the committed states.
    store = CheckpointStore(run_dir, keep_every=10, spec=spec, batch_fn=lambda t: tr.batch(t % STEPS + 1))
    with pytest.raises(CheckpointError, match="regenerated state after step 11 does not match leaf 11"):
        store.state(12)
    with pytest.raises(CheckpointError, match="no batch source"):
        CheckpointStore(run_dir, spec=spec).state(3)
    with pytest.raises(CheckpointError, match="has no leaf"):
        store.state(STEPS + 1)


def test_leaves_file_survives_a_partial_append(tmp_path, trained):
    spec, ds, tr, run_dir = trained
    store = CheckpointStore(tmp_path / "r")
    for leaf in tr.store.leaves[:3]:
        store.append_leaf(leaf)
    with pytest.raises(CheckpointError, match="the next leaf is step 3"):
        store.append_leaf(tr.store.leaves[5])
    with open(store.leaves_path, "ab") as f:
        f.write(b"\x00\x30" + tr.store.leaves[3][:10])  # a crash mid-record
    again = CheckpointStore(tmp_path / "r")
    assert again.leaves == tr.store.leaves[:3]
    assert again.leaves_path.read_bytes().startswith(LEAVES_MAGIC)
    assert again.losses() == [x.loss for x in tr.store.parsed_leaves[1:3]]
    again.append_leaf(tr.store.leaves[3])
    assert CheckpointStore(tmp_path / "r").leaves == tr.store.leaves[:4]


def test_leaves_file_refuses_foreign_records(tmp_path):
    p = tmp_path / "r"
    p.mkdir()
    leaf = step_leaf(1, bytes(32), 0)
    (p / "leaves.bin").write_bytes(LEAVES_MAGIC + len(leaf).to_bytes(2, "big") + leaf)
    with pytest.raises(CheckpointError, match="record 0 is the leaf of step 1"):
        CheckpointStore(p)
    (p / "leaves.bin").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="bad magic"):
        CheckpointStore(p)
