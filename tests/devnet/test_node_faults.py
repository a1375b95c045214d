"""Test faults live in devnet's hooks, not in a node's config: the production hooks steer nothing,
devnet's fault hooks force exactly the documented witnesses, and bad names are refused."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from commitments.hashing import digest
from devnet.node_faults import LAZY_PROOF_DOMAIN, FaultHooks
from node.hooks import KILL_POINTS, ForcedWitness, NodeHooks
from pot.cli import app

CID, LEAF_HASH = b"\x11" * 32, b"\x22" * 32


def test_the_production_hooks_steer_nothing():
    hooks = NodeHooks()
    assert hooks.fault == "none" and not hooks.skips_work()
    assert hooks.witness(challenge_id=CID, account="v1", leaf_hash=LEAF_HASH, declared_bucket=3) is None
    for point in KILL_POINTS:
        hooks.reached(point)  # returns: the process lives on


def test_the_lazy_node_skips_work_and_forces_the_public_value_with_a_made_up_proof():
    hooks = FaultHooks("lazy")
    assert hooks.skips_work()
    w = hooks.witness(challenge_id=CID, account="v4", leaf_hash=LEAF_HASH, declared_bucket=-7)
    assert w == ForcedWitness(LEAF_HASH, digest(LAZY_PROOF_DOMAIN, CID, "v4"), -7)
    assert hooks.witness(challenge_id=CID, account="v4", leaf_hash=LEAF_HASH, declared_bucket=None).norm_bucket == 0


def test_the_noisy_node_works_then_forces_a_fresh_random_pair():
    hooks = FaultHooks("noise")
    assert not hooks.skips_work()
    a = hooks.witness(challenge_id=CID, account="v3", leaf_hash=LEAF_HASH, declared_bucket=1)
    b = hooks.witness(challenge_id=CID, account="v3", leaf_hash=LEAF_HASH, declared_bucket=1)
    assert a is not None and b is not None and a != b and LEAF_HASH not in (a.value_hash, b.value_hash)


def test_an_honest_fault_hook_forces_nothing_and_a_kill_point_other_than_its_own_is_passed():
    hooks = FaultHooks("none", kill_at="journaled")
    assert hooks.witness(challenge_id=CID, account="v1", leaf_hash=LEAF_HASH, declared_bucket=0) is None
    hooks.reached("fetched")  # not its point: the process lives on


@pytest.mark.parametrize("fault, kill_at, needle", [
    ("lies", None, "fault must be one of none, noise, lazy"),
    ("none", "later", "kill_at must be one of event_ingested"),
])
def test_bad_names_are_refused(fault, kill_at, needle):
    with pytest.raises(ValueError, match=needle):
        FaultHooks(fault, kill_at)
    args = ["devnet", "node", "--config", "missing.toml", "--fault", fault, *(["--kill-at", kill_at] if kill_at else [])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and needle in result.output


def test_a_forced_witness_has_a_range():
    with pytest.raises(ValueError, match="32 bytes"):
        ForcedWitness(b"\x00" * 31, b"\x00" * 32, 0)
    with pytest.raises(ValueError, match="signed 32-bit"):
        ForcedWitness(b"\x00" * 32, b"\x00" * 32, -(2**31))


def test_pot_node_run_takes_no_fault():
    out = CliRunner().invoke(app, ["node", "run", "--help"]).output
    assert "--fault" not in out and "--kill-at" not in out
