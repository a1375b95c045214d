"""The adversary matrix on the protocol state machine: each row's verdict and exactly who pays."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chain.calls import UnbondVerifier
from devnet import protocol_matrix as M

# row -> (final verdict, accounts that pay, miner slashed)
EXPECTED = {
    "lazy": ("honest", 1, False),
    "sybil": ("honest", 3, False),
    "lazy-sybils-fraud": ("fraud", 3, True),
    "split-refusals": ("fraud", 0, True),
    "stalled-opening": ("fraud", 0, True),
    "prover-offline": ("honest", 0, False),
    "grinding": ("fraud", 0, True),
    "copied-commitment": ("honest", 1, False),
    "no-show": ("honest", 3, False),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_row(name):
    row = M.ROWS[name]()
    verdict, payers, slashed = EXPECTED[name]
    assert row.verdict == verdict, row.detail
    assert len(row.penalized) == payers and set(row.penalized) == set(row.expected_payers), row.penalized
    assert (row.miner_slashed > 0) == slashed
    assert row.ok, row.as_json()


def test_lazy_verifier_reveals_public_data_and_pays():
    row = M.row_lazy_verifier()
    (lazy,) = row.penalized
    assert row.penalized[lazy] == M._params().outlier_penalty


def test_lazy_sybils_cannot_pass_a_forged_step():
    """Three lazy accounts agreeing with the forged leaf never win: without the post-state they
    cannot agree on a proof, so each is a cluster of one, and the dispute round's plurality of two
    honest replayers decides."""
    row = M.row_lazy_sybils_on_fraud()
    assert row.rounds == 3 and row.verdict == "fraud"
    assert set(row.penalized) == {"l0", "l1", "l2"}


def test_colluding_lazy_majority_is_the_documented_limit():
    """What collusion can still do (docs/protocol.md): a miner that hands its forged post-state's
    proof to a majority of the committee gets its forged leaf passed, and the honest minority pays."""
    net = M.Net(M._params(forced_challenge_steps=(5,)), faked=frozenset({5}))
    first = M.setup(net, {"h0": 100, "h1": 100, "c0": 100, "c1": 100, "c2": 100})
    shared = (M.witness_value_hash(net.leaves[5]), b"\x07" * 32)
    rounds = M.play_challenge(net, first, lambda r: lambda n, ch, who: shared if who.startswith("c")
                              else n.honest_pair(ch))
    assert rounds[-1].verdict == "honest"
    assert set(net.penalties()) == {"h0", "h1"}


def test_front_run_copy_is_refused_and_the_owner_registers():
    row = M.row_front_run()
    assert row.ok and "RunIdNotOwned" not in row.detail and "derive_run_id" in row.detail


def test_slow_spec_is_refused_and_big_specs_get_longer_windows():
    row = M.row_slow_spec()
    assert row.verdict == "refused" and row.ok, row.detail


def test_an_unbonding_verifier_still_pays_for_its_seat():
    net = M.Net(M._params())
    first = M.setup(net, {f"v{i}": 100 for i in range(5)})
    leaver = first.committee[0]
    net.block((leaver, UnbondVerifier(amount=100)))
    M.play_challenge(net, first, lambda r: lambda n, ch, who: "absent" if who == leaver else n.honest_pair(ch))
    assert net.penalties() == {leaver: 50}
    assert net.state.vbonds[leaver] == 0 and net.state.unbonding[leaver][0][1] == 50


def test_cli_prints_the_matrix_as_json():
    out = subprocess.run([sys.executable, "-m", "pot", "redteam", "--protocol", "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ok"] and {r["row"] for r in doc["rows"]} >= {"lazy verifier", "Sybil garbage", "slow spec"}
    bad = subprocess.run([sys.executable, "-m", "pot", "redteam", "--protocol", "--only", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown row" in bad.stderr


def test_unbonding_waits_while_the_verifier_sits_on_an_open_challenge():
    """A committee member that unbonds cannot have its bond released before its seat is settled,
    however long the rounds last."""
    net = M.Net(M._params(unbonding_delay=1, commit_window=6, reveal_window=6))
    first = M.setup(net, {f"v{i}": 100 for i in range(5)})
    leaver = first.committee[0]
    net.block((leaver, UnbondVerifier(amount=100)), (M.MINER, net.opening(first)))
    net.until(first.commit_deadline - 2)  # long past the release block
    assert net.state.unbonding[leaver][0][1] == 100
    assert not [e for e in net.events if e.code == "BondReleased"]
    M.play_round(net, first, lambda n, ch, who: "absent" if who == leaver else n.honest_pair(ch), open_it=False)
    net.block()
    released = [e for e in net.events if e.code == "BondReleased"]
    assert [(e.verifier, e.amount) for e in released] == [(leaver, 50)]  # what the penalty left


def test_dispute_seats_scale_by_stake_not_by_name():
    from challenges.derive import dispute_seats

    eligible = [("a-early", 100), ("z-late", 100 * 9)]
    seats = dispute_seats(eligible, 100, cap=5)
    assert seats.count("z-late") > seats.count("a-early") >= 1
    assert dispute_seats(eligible, 100, cap=100) == ["a-early"] + ["z-late"] * 9


def test_bonds_are_capped_so_a_committee_draw_always_ends():
    from chain.calls import BondVerifier
    from chain.protocol.params import MAX_BOND

    net = M.Net(M._params())
    net.block(("whale", BondVerifier(amount=MAX_BOND)), ("whale", BondVerifier(amount=1)),
              ("other", BondVerifier(amount=2**64 - 1)))
    refused = [e for e in net.events if e.code == "CallRefused"]
    assert [(e.origin, e.refusal) for e in refused] == [("whale", "FieldTooLarge"), ("other", "FieldTooLarge")]
    assert net.state.vbonds == {"whale": MAX_BOND}


def test_a_re_challenged_step_never_stops_the_draws_of_a_short_run():
    """Every step of a 10-step run challenged, rounds re-challenged while draws are still being
    issued: block processing goes on (a step counted once per round used to exhaust the draw)."""
    net = M.Net(M._params(challenges_per_run=10, opening_deadline=1, commit_window=1, reveal_window=1), steps=10)
    first = M.setup(net, {f"v{i}": 100 for i in range(5)})
    for ch in list(net.issued()):
        if ch.round == 1 and net.number < ch.opening_deadline:
            net.block((M.MINER, net.opening(ch)))
    net.until(80)
    steps = {c.step for c in net.issued()}
    assert steps == set(range(1, 11)) and any(c.round > 1 for c in net.issued())
    assert first.step in steps
