"""The trainer reads what the chain made of each of its calls and says so as it happens: a late
opening is refused (OpeningTooLate) and reported, never taken for an answer; a refused root
raises; `pot miner train` never creates a dev chain."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from chain.dev import DevTransport
from chain.protocol import ChallengeIssued
from chain.view import ChainView
from commitments.dataset import Dataset
from miner.cli import miner_app
from miner.trainer import Trainer, TrainerError
from tests.miner.helpers import corpus, tiny_spec
from tests.miner.test_recipe import spec_toml
from tests.miner.test_trainer import PARAMS, STEPS, chain


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("data"))


def _trained(tmp_path, data, logs):
    spec = tiny_spec(STEPS)
    miner = chain(tmp_path / "chain.db")
    tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, progress=False,
                 log=logs.append, submit_timeout=10)
    tr.prepare()
    tr.register()
    tr.train()
    tr.submit_root()
    return tr, miner


def test_a_late_opening_is_reported_as_refused_and_not_answered(tmp_path, data):
    logs: list[str] = []
    tr, miner = _trained(tmp_path, data, logs)
    assert any(m.startswith("start_training_commitment accepted in block") for m in logs), logs
    view = ChainView(DevTransport(tmp_path / "chain.db", "observer"), PARAMS)
    issued: list = []
    while not issued:
        miner.seal()
        issued = [e for e in view.sync() if isinstance(e, ChallengeIssued)]
    (ev,) = issued
    while miner.finalized_head() < ev.opening_deadline:  # the miner sleeps through its deadline
        miner.seal()
    with pytest.raises(TrainerError, match=f"refused the opening of step {ev.step}: .*OpeningTooLate"):
        tr.answer(ev)
    said = [m for m in logs if "the chain refused it" in m]
    assert (
        len(said) == 1
        and f"open step {ev.step}: the chain refused it: submit_opening refused in block" in said[0]
    )
    assert "OpeningTooLate" in said[0]
    assert ev.challenge_id not in tr.answered and "OpeningTooLate" in tr.refused[ev.challenge_id]
    tr.close()


def test_a_refused_root_raises_and_keeps_the_submitted_size(tmp_path, data):
    logs: list[str] = []
    tr, _ = _trained(tmp_path, data, logs)
    assert tr.submitted_size == STEPS + 1
    tr.tree.append(b"\x00" * 32)  # a tree of declared_steps + 2 leaves: the chain refuses its size
    with pytest.raises(TrainerError, match=f"root of size {STEPS + 2} was not taken: .*BadRootSize"):
        tr.submit_root()
    assert tr.submitted_size == STEPS + 1
    assert any("BadRootSize" in m and "the chain refused it" in m for m in logs)
    tr.close()


def test_train_refuses_a_missing_dev_chain_and_creates_none(tmp_path, data):
    spec = spec_toml(tmp_path / "spec.toml")  # the chain is checked after the spec: a real one
    missing = tmp_path / "nowhere" / "chain.db"
    r = CliRunner().invoke(
        miner_app,
        [
            "train",
            "--spec",
            str(spec),
            "--data",
            str(corpus(tmp_path)),
            "--out",
            str(tmp_path / "run"),
            "--chain",
            f"dev://{missing}",
            "--no-serve",
        ],
    )
    assert r.exit_code == 2 and f"no dev chain at {missing}" in r.output, r.output
    assert f"`pot chain dev --db {missing} --interval 1`" in r.output
    assert not missing.parent.exists()
