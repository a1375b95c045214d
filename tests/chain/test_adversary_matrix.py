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
    "commit-flood": ("honest", 12, False),
    "half-served-dispute": ("fraud", 0, True),
    "dust-bonds": ("refused", 0, False),
    "one-bond-many-committees": ("honest", 1, False),
    "lazy-majority-escalated": ("fraud", 2, True),
    "split-stake": ("no gain", 0, False),
    "seat-withholder": ("honest", 1, False),
}


def test_every_row_is_asserted():
    assert set(M.ROWS) - set(EXPECTED) == {"front-run", "slow-spec"}  # each has its own test below


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
    proof to accounts holding most of the network's free stake gets its forged leaf passed. The
    honest seats of round 1 escalate; the dispute round, every free seat unit of the network, is
    the colluders' too: the escalators forfeit their stakes to it and the honest seats pay."""
    p = M._params(forced_challenge_steps=(5,))
    net = M.Net(p, faked=frozenset({5}))
    bonds = {"h0": 700, "h1": 700, "c0": 1000, "c1": 1000, "c2": 1000}
    h = M._unlucky_hash(net, bonds, p.committee_size,
                        lambda c: sum(a[0] == "c" for a in c) >= 3 and {"h0", "h1"} <= set(c))
    first = M.setup(net, bonds, block_hash=h)
    shared = (M.witness_value_hash(net.leaves[5]), b"\x07" * 32)
    rounds = M.play_challenge(net, first, lambda r: lambda n, ch, who: shared if who.startswith("c")
                              else n.honest_pair(ch))
    assert [(r.round, r.verdict) for r in rounds] == [(1, "inconclusive"), (p.max_rounds, "honest")]
    settled = {e.verifier: (e.returned, e.forfeited) for e in net.events if e.code == "EscalationSettled"}
    assert settled == {"h0": (0, p.escalation_stake), "h1": (0, p.escalation_stake)}
    assert set(net.penalties()) == {"h0", "h1"} and net.slashed() == 0
    pool = {e.verifier for e in net.events if e.code == "VerifierPaid" and e.why == "dispute_pool"}
    assert pool == {"c0", "c1", "c2"}
    assert not M.books(net)


def test_a_colluding_majority_of_the_committee_but_not_of_the_stake_is_caught():
    """The same collusion holding two of three round-1 seats but a small part of the stake: the
    honest seat escalates and the dispute round judges fraud."""
    row = M.row_lazy_majority_escalated()
    assert row.ok, row.as_json()
    assert row.rounds == 2 and row.verdict == "fraud" and row.miner_slashed == M._params().slash_amount
    assert row.penalized == {"l0": 100, "l1": 100}  # 50 a seat in round 1 and in the dispute round
    assert "escalated to the dispute round by 1" in row.detail
    assert set(row.paid) == {"h0", "h1", "h2"}  # the dispute's winning seats share the fee pool and the slash


def test_front_run_copy_is_refused_and_the_owner_registers():
    row = M.row_front_run()
    assert row.ok and "RunIdNotOwned" not in row.detail and "derive_run_id" in row.detail


def test_slow_spec_is_refused_and_big_specs_get_longer_windows():
    row = M.row_slow_spec()
    assert row.verdict == "refused" and row.ok, row.detail


def test_a_seated_verifier_cannot_unbond_its_collateral_and_pays_for_its_seat():
    """A seat reserves verifier_stake of its account's bond until the round is settled: unbonding
    it is refused (BondReserved), free bond above it may go, and the penalty comes out of the
    reservation in full."""
    net = M.Net(M._params())
    first = M.setup(net, {f"v{i}": 100 for i in range(4)} | {"v4": 300})
    leaver = "v4"
    seats = first.committee.count(leaver)
    assert seats >= 1 and net.state.reserved[leaver] == 100 * seats
    free = 300 - 100 * seats
    net.block((leaver, UnbondVerifier(amount=300)), (leaver, UnbondVerifier(amount=free + 100)),
              (leaver, UnbondVerifier(amount=free)))
    assert [e.refusal for e in net.events if e.code == "CallRefused"] == ["BondReserved", "BondReserved"]
    M.play_challenge(
        net, first, lambda r: lambda n, ch, who: "absent" if who == leaver else n.honest_pair(ch)
    )
    assert net.penalties() == {leaver: 50 * seats}
    assert net.state.vbonds[leaver] == 300 - free - 50 * seats and net.state.unbonding[leaver][0][1] == free
    assert leaver not in net.state.reserved and not M.books(net)


def test_cli_prints_the_matrix_as_json():
    out = subprocess.run(
        [sys.executable, "-m", "pot", "redteam", "--protocol", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ok"] and {r["row"] for r in doc["rows"]} >= {
        "lazy verifier",
        "Sybil garbage",
        "slow spec",
        "stake split for dispute seats",
    }
    bad = subprocess.run([sys.executable, "-m", "pot", "redteam", "--protocol", "--only", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown row" in bad.stderr


def test_unbonding_after_the_seat_is_settled_releases_what_the_penalty_left():
    """A committee member's collateral stays in the protocol however long the rounds last: it can
    unbond only once its seat is settled, and then only what its penalty left."""
    net = M.Net(M._params(unbonding_delay=1, commit_window=6, reveal_window=6))
    first = M.setup(net, {f"v{i}": 100 for i in range(5)})
    leaver = first.committee[0]
    net.block((leaver, UnbondVerifier(amount=100)), (M.MINER, net.opening(first)))
    assert [e.refusal for e in net.events if e.code == "CallRefused"] == ["BondReserved"]
    net.until(first.commit_deadline - 2)
    assert net.state.reserved[leaver] == 100 and leaver not in net.state.unbonding
    M.play_round(
        net, first, lambda n, ch, who: "absent" if who == leaver else n.honest_pair(ch), open_it=False
    )
    assert net.state.vbonds[leaver] == 50 and leaver not in net.state.reserved
    net.block((leaver, UnbondVerifier(amount=50)))
    net.block()
    released = [e for e in net.events if e.code == "BondReleased"]
    assert [(e.verifier, e.amount) for e in released] == [(leaver, 50)]  # what the penalty left
    assert leaver not in net.state.verifiers  # an emptied account leaves the registry


def test_dispute_seats_scale_by_stake_not_by_name():
    from challenges.derive import dispute_seats, seat_units

    units = seat_units([("a-early", 100), ("z-late", 100 * 9)], 100)
    h, cid = b"\x01" * 32, b"\x02" * 32
    seats = dispute_seats(h, cid, units, cap=5)
    assert len(seats) == 5 and seats.count("z-late") > seats.count("a-early")
    assert dispute_seats(h, cid, units, cap=100) == ["a-early"] + ["z-late"] * 9
    # a-early's exact share of 5 seats is 0.5: the lottery gives it its seat at half of the draws
    draws = [dispute_seats(bytes([k]) * 32, cid, units, cap=5).count("a-early") for k in range(200)]
    assert set(draws) == {0, 1} and 80 <= sum(draws) <= 120


def test_bonds_are_capped_so_a_committee_draw_always_ends():
    from chain.calls import BondVerifier
    from chain.protocol.params import MAX_BOND

    net = M.Net(M._params())
    net.block(("whale", BondVerifier(amount=MAX_BOND)), ("whale", BondVerifier(amount=1)),
              ("other", BondVerifier(amount=2**64 - 1)))
    refused = [e for e in net.events if e.code == "CallRefused"]
    assert [(e.origin, e.refusal) for e in refused] == [
        ("whale", "FieldTooLarge"),
        ("other", "FieldTooLarge"),
    ]
    assert net.state.vbonds == {"whale": MAX_BOND}


def test_a_re_challenged_step_never_stops_the_draws_of_a_short_run():
    """Every step of a 10-step run challenged, rounds re-challenged while draws are still being
    issued: block processing goes on (a step counted once per round used to exhaust the draw)."""
    net = M.Net(
        M._params(challenges_per_run=10, opening_deadline=1, commit_window=1, reveal_window=1), steps=10
    )
    first = M.setup(net, {f"v{i}": 2000 for i in range(5)})  # 100 seat units: rounds sit side by side
    for ch in list(net.issued()):
        if ch.round == 1 and net.number < ch.opening_deadline:
            net.block((M.MINER, net.opening(ch)))
    net.until(80)
    steps = {c.step for c in net.issued()}
    assert steps == set(range(1, 11)) and any(c.round > 1 for c in net.issued())
    assert first.step in steps


# --- protocol v3: the rows of the v3 issue's findings, beyond test_row ---------------------------

def test_a_commitment_flood_neither_crowds_out_a_seat_nor_lands_before_the_opening():
    row = M.row_commit_flood()
    assert row.ok, row.as_json()
    assert row.detail.startswith("27 seats of 15 accounts, 15 commitments taken; 12 refused NoOpening, "
                                 "1 NotInCommittee")
    assert row.penalized == {f"s{i:02d}": 50 for i in range(12)}


def test_a_forger_serving_half_the_dispute_seats_is_fraud():
    row = M.row_half_served_dispute()
    assert row.ok, row.as_json()
    assert (
        "round 3: fraud (0 seats of the dispute round back H(leaf t) with one replayed pair, 4 oppose it"
        in row.detail
    )
    assert not row.penalized  # the refused seats did their duty, the served ones told the truth


def test_a_full_registry_costs_a_seat_each_and_frees_a_slot_when_an_account_empties():
    row = M.row_dust_bonds()
    assert row.ok, row.as_json()
    assert "16 dust bonds refused" in row.detail and "the newcomer joined: True" in row.detail


def test_one_bond_never_sits_on_more_seats_than_it_backs_and_pays_every_penalty_in_full():
    row = M.row_one_bond_many_committees()
    assert row.ok, row.as_json()
    seats = int(row.detail.split("w held ")[1].split(" ")[0])
    assert row.penalized == {"w": 50 * seats} and 50 * seats <= 300


def test_splitting_a_stake_gains_no_dispute_seats():
    row = M.row_split_stake_dispute(samples=64)
    assert row.ok, row.as_json()
    import re

    whole, split = map(int, re.match(r"seats on chain: one account (\d+), split (\d+);", row.detail).groups())
    assert {whole, split} <= {819, 820}  # floor or ceiling of 1000 x 4096 / 5000 = 819.2


def test_a_withheld_seat_costs_the_quorum_one_seat():
    row = M.row_seat_withholder()
    assert row.ok, row.as_json()
    assert row.rounds == 1 and row.penalized == {"w": 50}


def test_the_books_are_not_vacuous():
    """`books` (every row's accounting check) reports a stray reservation, a penalty off the rule
    and a negative bond."""
    net = M.Net(M._params())
    first = M.setup(net, {f"v{i}": 100 for i in range(5)})
    assert not M.books(net)  # the open round holds exactly what is reserved
    M.play_challenge(net, first, lambda r: lambda n, ch, who: "absent" if who == "v0" else n.honest_pair(ch))
    assert not M.books(net)
    net.state.reserved["v1"] = 7
    assert any("reservations" in b for b in M.books(net))
    del net.state.reserved["v1"]
    penalty = next(e for e in net.events if e.code == "VerifierPenalized")
    net.events.append(
        M.P.VerifierPenalized(penalty.block, penalty.challenge_id, penalty.verifier, 1, "no_commit")
    )
    assert any("the rule says" in b for b in M.books(net))
    net.events.pop()
    net.state.vbonds["v2"] = -1
    assert any("bond of -1" in b for b in M.books(net))


def test_finding_lazy_guesses_of_the_public_value_do_not_pool_into_a_dispute_majority():
    """A core finding (challenges.verdict._dispute, since 040b299): the dispute round counts as
    backing the miner every reveal whose value half is H(leaf t), whatever its proof half. H(leaf t)
    is public (OpeningSubmitted), so three lazy accounts that each reveal it with a proof they made
    up -- three clusters of one, agreeing on nothing a replay gives -- outweigh two replayers that
    agree on the whole pair, and a forged step passes (the honest replayers pay as outliers). The
    witness pair exists to stop exactly this: the backing must be the miner's value's largest
    whole-pair cluster, not the sum of every pair that copies the public half. This is what the
    matrix's "lazy Sybils on a fraudulent step" row plays on the state machine."""
    from fractions import Fraction

    from challenges.verdict import FRAUD, Reveal, decide

    leaf, truth, proof = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    lazy = [Reveal(f"l{i}", leaf, 0, bytes([0x10 + i]) * 32) for i in range(3)]
    honest = [Reveal(f"h{i}", truth, 0, proof) for i in range(2)]
    result = decide(
        lazy + honest,
        mode="value",
        opening_submitted=True,
        expected_value=leaf,
        quorum_min_reveals=2,
        quorum_share=Fraction(1, 2),
        committee_size=5,
        dispute=True,
        refused_value=b"\xff" * 32,
        seats={r.verifier: 1 for r in lazy + honest},
        honest_share=Fraction(1, 2),
    )
    assert result.verdict == FRAUD, result.reason
