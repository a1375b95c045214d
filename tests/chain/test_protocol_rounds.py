"""The protocol's rounds (protocol v3): verifier bonds and unbonding, committees drawn without
replacement from seat units of free bond, penalties paid from a seat's reserved collateral, one
challenge per block, re-challenge rounds up to the dispute round (proportional seats, its
availability rule and its ties), the refused opening's second window, windows sized from the
replay cost, and snapshots of all of it. Escalations, fees and settlement: test_protocol_stakes."""

from __future__ import annotations

import copy
import dataclasses
from fractions import Fraction

import pytest

from chain import protocol as P
from chain.calls import EscalateChallenge, UnbondVerifier
from chain.protocol.cost import replay_cost
from chain.protocol.params import ParamRangeError
from challenges.derive import dispute_seats, draw_committee, rechallenge_id, seat_units
from challenges.refused import REFUSED_BUCKET, refused_pair
from commitments import cbor
from commitments.hashing import digest
from commitments.spec import Spec
from tests.chain.puretest import PureChain
from tests.chain.runs import SyntheticRun, bond, witness

REPO_SPECS = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "specs"

# Small windows; a committee of 3 seats in round 1, 6 in round 2, everyone from round 3 on.
PARAMS = P.ProtocolParams(commit_window=3, reveal_window=3, opening_deadline=3, challenge_delay=1,
                          challenges_per_run=1, quorum_min_reveals=2, committee_size=3, max_rounds=3,
                          verifier_stake=100, no_show_penalty=30, outlier_penalty=40, unbonding_delay=10,
                          slash_amount=400, miner_stake=1000)
NOISE = digest("pot/test/noise", 1)


class Net:
    """One run on a pure chain, with verifiers bonded in the registration block."""

    def __init__(
        self, bonds: dict[str, int], params: P.ProtocolParams = PARAMS, run: SyntheticRun | None = None
    ):
        self.chain = PureChain(params)
        self.run = run or SyntheticRun()
        self.chain.block(("miner", self.run.register()), *[(v, bond(b)) for v, b in bonds.items()])

    @property
    def state(self) -> P.ProtocolState:
        return self.chain.state

    def issue(self) -> P.ChallengeIssued:
        self.chain.block(("miner", self.run.submit_full_root()))
        while not self.chain.of(P.ChallengeIssued):
            self.chain.block()
        return self.chain.of(P.ChallengeIssued)[0]

    def open(self, ch: P.ChallengeIssued) -> None:
        self.chain.block(("miner", self.run.opening(ch.challenge_id, ch.step)))

    def play(self, ch: P.ChallengeIssued, reveals: dict[str, tuple[bytes, bytes | None] | None],
             *, bucket: dict[str, int] | None = None) -> list[P.Event]:
        """Committee members commit (value, proof) in one block (None: commits, never reveals),
        reveal in one block after the commit window; the events of the resolution block."""
        bucket = bucket or {}
        pairs = {v: witness(ch.challenge_id, v, vp[0] if vp else NOISE, bucket.get(v, 0),
                            proof_hash=vp[1] if vp else None)
                 for v, vp in reveals.items()}
        if pairs:
            self.chain.block(*[(v, com) for v, (com, _) in pairs.items()])
        self.chain.advance_to(ch.commit_deadline)
        shown = [(v, rev) for v, (_, rev) in pairs.items() if reveals[v] is not None]
        if shown:
            self.chain.block(*shown)
        self.chain.advance_to(ch.escalate_deadline)  # a dispute round's is its reveal deadline
        return self.chain.block()

    def good(self, ch: P.ChallengeIssued) -> tuple[bytes, None]:
        return self.run.value_hash(ch.step), None  # None: the honest proof of this challenge


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


# v1 holds three times the others' bond; all hold enough to sit through several penalties, and
# their 100 seat units leave room for the committees of concurrent rounds.
EIGHT = {"v1": 3000, **{f"v{i}": 1000 for i in range(2, 9)}}


# --- bonds --------------------------------------------------------------------------------------


def test_bond_top_up_and_unbond_then_release_after_the_delay():
    chain = PureChain(PARAMS)
    # A first bond brings the active bond to at least verifier_stake, one seat's collateral.
    with pytest.raises(
        P.BondBelowMinimum,
        match="'v1' would hold an active bond of 60; a verifier bonds at least verifier_stake \\(100\\)",
    ):
        chain.block(("v1", bond(60)))
    assert chain.state.verifiers == [] and chain.state.vbonds == {} and chain.state.bonds == {}
    (ev,) = chain.block(("v1", bond(150)))
    assert (ev.verifier, ev.amount, ev.bond) == ("v1", 150, 150) and ev.block == 2
    assert P.eligible_verifiers(chain.state) == [("v1", 150)]
    (ev,) = chain.block(("v1", bond(10)))  # a top-up of any size once the bond holds the minimum
    assert (ev.amount, ev.bond) == (10, 160)
    assert chain.state.bonds["v1"] == 160 and chain.state.verifiers == ["v1"]
    # A partial unbond leaves at least verifier_stake active, or nothing.
    with pytest.raises(
        P.BondBelowMinimum,
        match="would leave 60, below verifier_stake \\(100\\): unbond all of it, or at most 60",
    ):
        chain.block(("v1", UnbondVerifier(100)))
    (ev,) = chain.block(("v1", UnbondVerifier(60)))
    assert isinstance(ev, P.VerifierUnbonding)
    first_release = 5 + PARAMS.unbonding_delay
    assert (ev.amount, ev.bond, ev.release_block) == (60, 100, first_release)
    assert chain.state.vbonds["v1"] == 100 and chain.state.unbonding == {"v1": [[first_release, 60]]}
    with pytest.raises(P.AmountOverBond, match="active bond of 100; it cannot unbond 101"):
        chain.block(("v1", UnbondVerifier(101)))
    (ev,) = chain.block(("v1", UnbondVerifier(100)))  # all of it
    assert (ev.bond, ev.release_block) == (0, 7 + PARAMS.unbonding_delay)
    assert P.eligible_verifiers(chain.state) == []  # leaves the draws at once
    with pytest.raises(P.NotBonded, match="'v1' has no active bond"):
        chain.block(("v1", UnbondVerifier(1)))
    with pytest.raises(P.NotBonded, match="'v9' has no active bond"):
        chain.block(("v9", UnbondVerifier(1)))
    assert chain.advance_to(first_release - 1) == []
    (rel,) = chain.block()
    assert isinstance(rel, P.BondReleased) and (rel.block, rel.verifier, rel.amount) == (
        first_release,
        "v1",
        60,
    )
    assert chain.state.verifiers == ["v1"]  # an amount still unbonding keeps it in the registry
    (rel,) = chain.advance_to(7 + PARAMS.unbonding_delay)
    assert (rel.verifier, rel.amount) == ("v1", 100)
    # Nothing active, unbonding or reserved: the account leaves the registry.
    assert chain.state.verifiers == [] and chain.state.vbonds == {} and chain.state.unbonding == {}
    assert chain.state.bonds["v1"] == 160  # the running total of what it ever bonded


def test_an_emptied_account_frees_its_registry_slot(monkeypatch):
    """MAX_VERIFIERS counts accounts that hold stake: one that unbonded everything and got it back
    makes room for another."""
    from chain.protocol import rules

    monkeypatch.setattr(rules, "MAX_VERIFIERS", 2)
    chain = PureChain(PARAMS)
    chain.block(("v1", bond(100)), ("v2", bond(100)))
    with pytest.raises(P.TooMany, match="2 accounts hold verifier bonds already"):
        chain.block(("v3", bond(100)))
    chain.block(("v1", UnbondVerifier(100)))
    with pytest.raises(P.TooMany):  # still unbonding: it holds stake
        chain.block(("v3", bond(100)))
    chain.advance_to(3 + PARAMS.unbonding_delay)
    assert chain.state.verifiers == ["v2"]
    (ev,) = chain.block(("v3", bond(100)))
    assert isinstance(ev, P.VerifierBonded) and chain.state.verifiers == ["v2", "v3"]
    (ev,) = chain.block(("v2", bond(5)))  # a member's top-up is no new entry
    assert ev.bond == 105


def test_unbonding_amounts_are_capped(monkeypatch):
    from chain.protocol import rules

    monkeypatch.setattr(rules, "MAX_UNBONDING_PER_VERIFIER", 2)
    chain = PureChain(PARAMS)
    chain.block(("v1", bond(300)))
    chain.block(("v1", UnbondVerifier(1)), ("v1", UnbondVerifier(1)))
    before = copy.deepcopy(chain.state)
    with pytest.raises(P.TooMany, match="2 unbonding amounts waiting"):
        chain.block(("v1", UnbondVerifier(1)))
    assert chain.state.unbonding == before.unbonding and chain.state.vbonds == before.vbonds


def test_the_miner_never_sits_on_its_own_committee():
    net = Net({"miner": 500, "v1": 100, "v2": 100})
    ch = net.issue()
    assert ch.committee == ("v1", "v2")
    net.open(ch)
    with pytest.raises(P.OwnChallenge):
        net.chain.block(("miner", witness(ch.challenge_id, "miner", net.run.value_hash(ch.step))[0]))


# --- committees ---------------------------------------------------------------------------------


def test_the_committee_is_drawn_from_the_issue_block_by_seat_units():
    net = Net(EIGHT)
    units = seat_units(P.eligible_verifiers(net.state, exclude="miner"), PARAMS.verifier_stake)
    assert dict(units) == {v: b // 100 for v, b in EIGHT.items()}
    ch = net.issue()
    block_hash = digest("pot/test/block/v1", ch.block)
    assert list(ch.committee) == draw_committee(block_hash, ch.challenge_id, units, PARAMS.committee_size)
    assert len(ch.committee) == 3 and all(ch.committee.count(v) <= k for v, k in units)
    assert net.state.challenges[ch.challenge_id].committee == list(ch.committee)
    # Every seat reserves verifier_stake of its account's free bond for the round's life.
    seats = {v: ch.committee.count(v) for v in set(ch.committee)}
    assert net.state.reserved == {v: 100 * k for v, k in seats.items()}
    assert net.state.challenges[ch.challenge_id].held == net.state.reserved
    assert all(P.free_bond(net.state, v) == EIGHT[v] - 100 * seats.get(v, 0) for v in EIGHT)
    net.open(ch)
    outsider = next(v for v in EIGHT if v not in ch.committee)
    with pytest.raises(
        P.NotInCommittee, match=f"'{outsider}' does not sit on the committee .* \\(round 1, 3 seats\\)"
    ):
        net.chain.block((outsider, witness(ch.challenge_id, outsider, net.run.value_hash(ch.step))[0]))


def test_with_no_free_seat_unit_the_challenge_waits_for_one():
    """No committee of no seats: a run's challenge is drawn only once the network has a free unit
    (here, once a verifier bonds), and then from that block's hash."""
    net = Net({})
    net.chain.block(("miner", net.run.submit_full_root()))
    net.chain.advance_to(net.chain.number + 5)
    assert net.chain.of(P.ChallengeIssued) == [] and net.state.runs[net.run.run_id].drawn == 0
    net.chain.block(("v1", bond(100)))  # bonded after this block's issuance
    (ch,) = net.chain.block()
    assert isinstance(ch, P.ChallengeIssued) and ch.committee == ("v1",) and ch.index == 0
    assert net.state.reserved == {"v1": 100}


# --- penalties ----------------------------------------------------------------------------------


def test_no_commit_no_reveal_and_outlier_are_penalised():
    net = Net({f"v{i}": 100 for i in range(1, 6)}, dataclasses.replace(PARAMS, committee_size=5))
    ch = net.issue()
    assert ch.committee == ("v1", "v2", "v3", "v4", "v5")  # no more units than seats: every unit sits
    net.open(ch)
    good = net.good(ch)
    events = net.play(ch, {"v1": good, "v2": good, "v3": good, "v4": (NOISE, None), "v5": None})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "honest" and res.outliers == ("v4",)
    pens = {(e.verifier, e.why, e.amount) for e in of(events, P.VerifierPenalized)}
    # v5 committed and never revealed; no one of the committee skipped the commit.
    assert pens == {("v5", "no_reveal", 30), ("v4", "outlier", 40)}
    assert all(e.challenge_id == ch.challenge_id for e in of(events, P.VerifierPenalized))
    fee = net.state.runs[ch.run_id].seat_fee
    assert {(e.verifier, e.amount) for e in of(events, P.VerifierPaid)} == {
        (v, fee) for v in ("v1", "v2", "v3")
    }
    assert net.state.vbonds == {"v1": 100 + fee, "v2": 100 + fee, "v3": 100 + fee, "v4": 60, "v5": 70}
    assert net.state.slashed == {"v4": 40, "v5": 30}
    assert net.state.burned == 70 and net.state.reserved == {}  # penalties are burned; every seat freed
    # Below the stake after its penalty: v4 sits on no later committee.
    assert "v4" not in dict(P.eligible_verifiers(net.state))


def test_a_seat_pays_its_penalty_from_its_reserved_collateral():
    """A seat reserves verifier_stake of its account's free bond until its round is settled: the
    reserved part cannot be unbonded (BondReserved), the free part can, and the penalty is taken
    from the reservation, never from an unbonding amount."""
    params = dataclasses.replace(PARAMS, no_show_penalty=50, unbonding_delay=40)  # released after the round
    net = Net({"v1": 100, "v2": 100, "v3": 120}, params)
    ch = net.issue()
    assert ch.committee == ("v1", "v2", "v3") and net.state.reserved == {"v1": 100, "v2": 100, "v3": 100}
    assert P.free_bond(net.state, "v3") == 20
    before = copy.deepcopy(net.state)
    with pytest.raises(
        P.BondReserved, match="'v3' has 20 of its bond of 120 free; the rest backs seats of open rounds"
    ):
        net.chain.block(("v3", UnbondVerifier(40)))
    assert net.state.vbonds == before.vbonds and net.state.unbonding == before.unbonding
    (ev,) = net.chain.block(("v3", UnbondVerifier(20)))  # the free part; 100 stays active
    assert (ev.amount, ev.bond) == (20, 100)
    net.open(ch)
    good = net.good(ch)
    events = net.play(ch, {"v1": good, "v2": good})
    (pen,) = of(events, P.VerifierPenalized)
    assert (pen.verifier, pen.why, pen.amount) == ("v3", "no_commit", 50)
    assert net.state.vbonds["v3"] == 50 and net.state.unbonding["v3"][0][1] == 20  # unbonding untouched
    assert net.state.reserved == {}  # the round is settled: its collateral left is free again
    assert P.free_bond(net.state, "v3") == 50
    released = net.chain.advance_to(net.chain.number + params.unbonding_delay)
    assert [e.amount for e in of(released, P.BondReleased) if e.verifier == "v3"] == [20]


def test_a_penalty_is_at_most_half_a_seats_collateral_and_an_emptied_account_leaves():
    # A unit of bond backs a round's seat and a dispute seat at once: their two penalties fit in it.
    with pytest.raises(ParamRangeError, match="no_show_penalty must be .* in 0..verifier_stake / 2 \\(50\\)"):
        dataclasses.replace(PARAMS, no_show_penalty=51)
    with pytest.raises(ParamRangeError, match="outlier_penalty"):
        dataclasses.replace(PARAMS, outlier_penalty=51)
    params = dataclasses.replace(PARAMS, no_show_penalty=50)
    net = Net({"v1": 100, "v2": 100, "v3": 100}, params)
    ch = net.issue()
    with pytest.raises(P.BondReserved):  # a seated account cannot run from its penalty
        net.chain.block(("v3", UnbondVerifier(100)))
    net.open(ch)
    good = net.good(ch)
    events = net.play(ch, {"v1": good, "v2": good})
    (pen,) = of(events, P.VerifierPenalized)
    assert (pen.verifier, pen.amount) == ("v3", 50) and net.state.slashed["v3"] == 50
    assert net.state.vbonds["v3"] == 50 and "v3" not in dict(P.eligible_verifiers(net.state))
    # Below verifier_stake after its penalty, it may still unbond all of it; once that is released
    # it holds nothing (active, unbonding or reserved) and leaves the registry.
    (ev,) = net.chain.block(("v3", UnbondVerifier(50)))
    assert ev.bond == 0 and "v3" in net.state.verifiers
    net.chain.advance_to(ev.release_block)
    assert "v3" not in net.state.verifiers and "v3" not in net.state.vbonds and "v3" not in net.state.reserved
    assert net.state.verifiers == ["v1", "v2"]


# --- one challenge per block --------------------------------------------------------------------


def test_challenges_of_a_run_come_one_per_block_and_are_spaced():
    params = dataclasses.replace(PARAMS, challenges_per_run=4)
    run = SyntheticRun(steps=40)
    net = Net(EIGHT, params, run)
    net.chain.block(("miner", run.submit_full_root()))
    root_block = net.chain.number
    blocks = [net.chain.block() for _ in range(6)]
    issued = [e for b in blocks for e in b if isinstance(e, P.ChallengeIssued)]
    assert [e.block for e in issued] == [root_block + 1 + i for i in range(4)]
    assert [e.index for e in issued] == [0, 1, 2, 3]
    steps = [e.step for e in issued]
    assert len(set(steps)) == 4
    assert all(abs(a - b) > 1 for a in steps for b in steps if a != b)  # no challenged step next to another
    assert len({e.committee for e in issued}) > 1  # each drawn from its own block
    assert net.state.runs[run.run_id].drawn == 4


def test_rechallenges_during_the_draws_do_not_count_as_taken_steps():
    """Early challenges re-challenged while later ones are still drawn: their repeated steps are
    not taken twice, so every step of a small run can still be drawn (before the fix the ninth
    block's draw raised DeriveError inside on_block, which stops a follower at that block)."""
    # One seat a first round, no penalties, and units for every concurrent committee: the seats
    # are bonded and stay away, so every round with its opening re-challenges.
    params = P.ProtocolParams(commit_window=1, reveal_window=1, opening_deadline=1, challenge_delay=1,
                              challenges_per_run=8, quorum_min_reveals=3, max_rounds=8, committee_size=1,
                              no_show_penalty=0)
    run = SyntheticRun(steps=8)
    chain = PureChain(params)
    chain.block(("miner", run.register()), *[(f"v{i}", bond(100 * 100)) for i in range(1, 4)])
    chain.block(("miner", run.submit_full_root()))
    for _ in range(20):  # the miner opens every round in time; no one witnesses: every round re-challenges
        chain.block(
            *[
                ("miner", run.opening(cid, ch.step))
                for cid, ch in chain.state.challenges.items()
                if ch.verdict is None and ch.opening is None and chain.number + 1 <= ch.opening_deadline
            ]
        )
    firsts = [c for c in chain.state.challenges.values() if c.round == 1]
    assert sorted(c.step for c in firsts) == list(range(1, 9)) and chain.state.runs[run.run_id].drawn == 8
    assert any(
        c.round > 1 and c.issued < max(f.issued for f in firsts) for c in chain.state.challenges.values()
    )


# --- rounds -------------------------------------------------------------------------------------


def test_an_inconclusive_round_rechallenges_with_a_larger_committee_and_longer_windows():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    c = list(ch.committee)
    one = next(v for v in c if c.count(v) == 1)
    events = net.play(ch, {one: net.good(ch)})  # one revealed seat: below quorum_min_reveals (seats)
    (res,) = of(events, P.ChallengeResolved)
    n = res.block
    assert res.verdict == "inconclusive" and res.round == 1 and "re-challenged" in res.reason
    assert res.rechallenge == rechallenge_id(ch.challenge_id, 2, digest("pot/test/block/v1", n))
    (nxt,) = of(events, P.ChallengeIssued)
    assert nxt.challenge_id == res.rechallenge and (nxt.round, nxt.first) == (2, ch.challenge_id)
    assert (nxt.run_id, nxt.step, nxt.index, nxt.root, nxt.size) == (
        ch.run_id,
        ch.step,
        ch.index,
        ch.root,
        ch.size,
    )
    assert len(nxt.committee) == 6  # committee_size doubled
    assert res.block == ch.escalate_deadline + 1 and nxt.block == n
    assert nxt.opening_deadline == n + 2 * PARAMS.opening_deadline
    assert nxt.commit_deadline == nxt.opening_deadline + 2 * PARAMS.commit_window
    assert nxt.reveal_deadline == nxt.commit_deadline + 2 * PARAMS.reveal_window
    # The absent committee members paid for not committing, a seat each.
    assert {(e.verifier, e.amount) for e in of(events, P.VerifierPenalized)} == {
        (v, PARAMS.no_show_penalty * c.count(v)) for v in c if v != one}
    old = net.state.challenges[ch.challenge_id]
    assert old.verdict == "inconclusive" and old.rechallenge == nxt.challenge_id
    assert net.state.challenges[nxt.challenge_id].first == ch.challenge_id
    assert net.state.runs[ch.run_id].challenges == [ch.challenge_id, nxt.challenge_id]
    # The new round needs a new opening: the old id's window is over, and without one the round is fraud.
    with pytest.raises(P.OpeningTooLate):
        net.chain.block(("miner", net.run.opening(ch.challenge_id, ch.step)))
    events = net.chain.advance_to(nxt.opening_deadline + 1)
    (res2,) = of(events, P.ChallengeResolved)
    assert res2.challenge_id == nxt.challenge_id and res2.verdict == "fraud" and "no opening" in res2.reason
    assert of(events, P.MinerSlashed)[0].challenge_id == nxt.challenge_id


def test_a_second_round_with_its_opening_resolves_honest():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    events = net.play(ch, {})
    (nxt,) = of(events, P.ChallengeIssued)
    net.open(nxt)  # the same leaf and file under the new id
    good = net.good(nxt)
    events = net.play(nxt, {v: good for v in nxt.committee[:4]})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "honest" and res.round == 2 and res.rechallenge is None and res.cluster_size == 4
    assert net.state.runs[ch.run_id].slashed == 0


def _dispute(net: Net) -> P.ChallengeIssued:
    """The run's challenge taken to its dispute round: two rounds with their openings and no reveal."""
    ch = net.issue()
    net.open(ch)
    r2 = of(net.play(ch, {}), P.ChallengeIssued)[0]
    net.open(r2)
    r3 = of(net.play(r2, {}), P.ChallengeIssued)[0]
    assert r3.round == PARAMS.max_rounds and r3.first == ch.challenge_id
    net.open(r3)
    return r3


def test_the_dispute_round_seats_every_unit_and_a_plurality_is_not_enough():
    """The dispute round seats every unit of bond (no other round open: the whole active bond),
    proportional, with no escalation window after it; it judges the miner, not the clusters: the
    step is honest only if the seats backing the miner's value hold more than
    dispute_honest_share (1/2) of the revealed seats. A plurality of them is fraud."""
    net = Net(EIGHT)
    r3 = _dispute(net)
    assert set(r3.committee) == set(EIGHT)  # every verifier (the no-shows kept enough bond)
    units = seat_units(sorted(net.state.vbonds.items()), PARAMS.verifier_stake)
    assert list(r3.committee) == dispute_seats(
        digest("pot/test/block/v1", r3.block), r3.challenge_id, units, 4096
    )
    assert list(r3.committee) == [v for v, k in units for _ in range(k)]  # fewer units than MAX_DISPUTE_SEATS
    assert r3.escalate_deadline == r3.reveal_deadline
    assert net.state.reserved == {}  # a dispute round's seats hold outside `reserved`
    held = net.state.challenges[r3.challenge_id].held
    assert held == {v: 100 * k for v, k in units}
    assert all(P.free_bond(net.state, v) == net.state.vbonds[v] - held[v] for v in EIGHT)
    seats = {v: r3.committee.count(v) for v in set(r3.committee)}
    assert seats["v1"] > seats["v2"] >= 1  # seats follow the bond
    good = net.good(r3)
    honest = ("v2", "v3", "v4", "v5")
    events = net.play(
        r3, {**{v: good for v in honest}, "v1": (NOISE, None), "v6": (digest("pot/x", 2), None)}
    )
    (res,) = of(events, P.ChallengeResolved)
    top, revealed = sum(seats[v] for v in honest), sum(seats[v] for v in (*honest, "v1", "v6"))
    assert top > seats["v1"] and top > seats["v6"] and Fraction(top, revealed) <= PARAMS.dispute_honest_share
    assert res.verdict == "fraud" and res.round == 3 and res.rechallenge is None
    assert res.winning_value == NOISE and set(res.outliers) == set(honest)  # those who backed the miner
    assert of(events, P.MinerSlashed)[0].amount == PARAMS.slash_amount


def test_the_dispute_round_is_honest_past_the_honest_share_and_its_penalties_pay_its_winners():
    net = Net(EIGHT)
    r3 = _dispute(net)
    seats = {v: r3.committee.count(v) for v in set(r3.committee)}
    good = net.good(r3)
    honest = ("v1", "v2", "v3")  # v1's 30 units and two others': more than half of what is revealed
    events = net.play(r3, {**{v: good for v in honest}, "v4": (NOISE, None), "v5": None})
    (res,) = of(events, P.ChallengeResolved)
    revealed = sum(seats[v] for v in (*honest, "v4"))
    assert Fraction(sum(seats[v] for v in honest), revealed) > PARAMS.dispute_honest_share
    assert res.verdict == "honest" and res.outliers == ("v4",) and of(events, P.MinerSlashed) == []
    pens = {(e.verifier, e.why, e.amount) for e in of(events, P.VerifierPenalized)}
    no_show = {(v, "no_commit", PARAMS.no_show_penalty * seats[v]) for v in ("v6", "v7", "v8")}
    assert pens == {("v4", "outlier", PARAMS.outlier_penalty * seats["v4"]),
                    ("v5", "no_reveal", PARAMS.no_show_penalty * seats["v5"]), *no_show}
    # The dispute round's penalties are not burned: they are its winning seats' pool.
    pool = sum(a for _, _, a in pens)
    shared = [e for e in of(events, P.VerifierPaid) if e.why == "dispute_pool"]
    assert {e.verifier for e in shared} == set(honest)
    share = pool // sum(seats[v] for v in honest)
    assert all(e.amount == share * seats[e.verifier] for e in shared)
    assert not [e for e in of(events, P.Burned) if "dispute_pool" not in e.why]


def test_past_max_dispute_seats_the_dispute_round_is_proportional():
    """6,000 seat units, at most 4,096 dispute seats: each account gets floor(units x 4096 / 6000)
    seats and the seat left over goes by the systematic lottery (challenges.derive.dispute_seats)."""
    from chain.protocol.params import MAX_DISPUTE_SEATS

    params = dataclasses.replace(PARAMS, max_rounds=1, verifier_stake=2, no_show_penalty=1, outlier_penalty=1)
    net = Net({"v1": 6000, "v2": 4000, "v3": 2000}, params)  # 3000 + 2000 + 1000 units
    ch = net.issue()
    assert ch.round == 1 and ch.escalate_deadline == ch.reveal_deadline  # every round is the dispute round
    units = [("v1", 3000), ("v2", 2000), ("v3", 1000)]
    assert list(ch.committee) == dispute_seats(digest("pot/test/block/v1", ch.block), ch.challenge_id, units,
                                               MAX_DISPUTE_SEATS)
    assert len(ch.committee) == MAX_DISPUTE_SEATS
    floors = {"v1": 2048, "v2": 1365, "v3": 682}  # 4095: one seat left for the lottery
    got = {v: ch.committee.count(v) for v in floors}
    assert all(floors[v] <= got[v] <= floors[v] + 1 for v in floors) and sum(got.values()) == 4096
    assert net.state.challenges[ch.challenge_id].held == {v: 2 * k for v, k in got.items()}


def test_refusals_count_against_the_miner_in_the_dispute_round():
    """Serving every seat is the miner's duty: refused seats count against it, so a miner that
    served seats holding only half of the revealed seats is fraud, however right it was there."""
    net = Net({"v1": 1000, "v2": 1000, "v3": 1000, "v4": 1000})
    r3 = _dispute(net)
    seats = {v: r3.committee.count(v) for v in set(r3.committee)}
    assert seats["v3"] + seats["v4"] <= seats["v1"] + seats["v2"]  # served: at most half the revealed seats
    refused = refused_pair(r3.challenge_id)
    good = net.good(r3)
    events = net.play(r3, {"v1": refused, "v2": refused, "v3": good, "v4": good})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "fraud" and res.winning_value == refused[0]
    assert res.outliers == ("v3", "v4")  # they backed the miner's value
    (slash,) = of(events, P.MinerSlashed)
    assert slash.amount == PARAMS.slash_amount
    assert {e.verifier for e in of(events, P.VerifierPaid)} == {"v1", "v2"}  # the refused seats' cluster


def test_a_tie_in_the_dispute_round_is_not_more_than_half_fraud():
    net = Net({"v1": 1000, "v2": 1000, "v3": 1000, "v4": 1000})
    r3 = _dispute(net)
    seats = {v: r3.committee.count(v) for v in set(r3.committee)}
    assert seats["v1"] == seats["v2"] > 0
    events = net.play(r3, {"v1": net.good(r3), "v2": (NOISE, None)})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "fraud" and res.outliers == ("v1",) and res.winning_value == NOISE


def test_too_few_reveals_in_the_dispute_round_leave_the_step_unresolved():
    """Below the quorum of revealed seats nothing decides the step: the miner's stake stays
    locked, and the run's escrow is forfeited (burned) when the run settles."""
    net = Net({"v1": 1000, "v2": 1000, "v3": 1000, "v4": 1000})  # enough bond to sit through the no-shows
    r3 = _dispute(net)
    events = net.play(r3, {})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "inconclusive" and res.rechallenge is None
    assert "unresolved after the dispute round" in res.reason
    assert of(events, P.ChallengeIssued) == [] and of(events, P.MinerSlashed) == []
    assert of(events, P.VerifierPaid) == []  # nobody won: no fee; the no-shows' penalties are burned
    run = net.state.runs[r3.run_id]
    assert run.slashed == 0 and net.state.bonds["miner"] == run.stake
    assert all(net.state.challenges[c].verdict is not None for c in run.challenges)
    (settled,) = of(events, P.RunSettled)
    assert (settled.stake_released, settled.escrow_released, settled.unresolved) == (0, 0, 1)
    assert settled.escrow_burned == run.escrow > 0 and run.escrow_left == 0 and run.settled
    assert any(isinstance(e, P.Burned) and e.subject == run.run_id and e.amount == run.escrow for e in events)


def test_a_refused_opening_gets_a_second_window_then_is_fraud():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    refused = refused_pair(ch.challenge_id)
    events = net.play(ch, {v: refused for v in ch.committee})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "inconclusive" and "second opening window" in res.reason
    assert res.winning_value == refused[0] and res.rechallenge is not None
    (r2,) = of(events, P.ChallengeIssued)
    assert r2.round == 2 and net.state.challenges[r2.challenge_id].refused_rounds == 1
    assert of(events, P.MinerSlashed) == [] and of(events, P.VerifierPenalized) == []
    net.open(r2)
    refused2 = refused_pair(r2.challenge_id)
    events = net.play(r2, {v: refused2 for v in r2.committee[:4]})
    (res2,) = of(events, P.ChallengeResolved)
    assert res2.verdict == "fraud" and "again" in res2.reason and res2.rechallenge is None
    (slash,) = of(events, P.MinerSlashed)
    assert slash.challenge_id == r2.challenge_id and slash.amount == PARAMS.slash_amount


def test_a_refused_round_then_a_usable_opening_is_honest():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    events = net.play(ch, {v: refused_pair(ch.challenge_id) for v in ch.committee})
    (r2,) = of(events, P.ChallengeIssued)
    net.open(r2)
    good = net.good(r2)
    (res,) = of(net.play(r2, {v: good for v in set(r2.committee)}), P.ChallengeResolved)
    assert res.verdict == "honest" and res.round == 2


def test_bucket_mode_refused_bucket_and_a_new_declaration_per_round():
    from chain.calls import DeclareWitnessNormBucket

    net = Net(EIGHT, run=SyntheticRun(profile="torch-native"))
    ch = net.issue()
    assert ch.mode == "bucket"
    net.open(ch)
    net.chain.block(("miner", DeclareWitnessNormBucket(ch.challenge_id, 7)))
    v, p = refused_pair(ch.challenge_id)
    events = net.play(
        ch, {c: (v, p) for c in ch.committee}, bucket=dict.fromkeys(ch.committee, REFUSED_BUCKET)
    )
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "inconclusive" and res.winning_value == REFUSED_BUCKET and res.rechallenge
    (r2,) = of(events, P.ChallengeIssued)
    assert net.state.challenges[r2.challenge_id].declared_bucket is None  # the new round is a new challenge
    net.open(r2)
    net.chain.block(("miner", DeclareWitnessNormBucket(r2.challenge_id, 7)))
    members = sorted(set(r2.committee))
    (res,) = of(net.play(r2, {c: (digest("pot/hw", i), None) for i, c in enumerate(members)},
                         bucket=dict.fromkeys(members, 7)), P.ChallengeResolved)
    assert res.verdict == "honest" and res.winning_value == 7


# --- escalation ---------------------------------------------------------------------------------


def _revealed(net: Net, ch: P.ChallengeIssued, reveals: dict[str, tuple[bytes, bytes | None]]) -> None:
    """Commit and reveal `reveals`, then stop at the round's reveal deadline: the next block is
    the first of its escalation window."""
    pairs = {v: witness(ch.challenge_id, v, vp[0], 0, proof_hash=vp[1]) for v, vp in reveals.items()}
    net.chain.block(*[(v, com) for v, (com, _) in pairs.items()])
    net.chain.advance_to(ch.commit_deadline)
    net.chain.block(*[(v, rev) for v, (_, rev) in pairs.items()])
    net.chain.advance_to(ch.reveal_deadline)


def _escalate(net: Net, who: str, ch: P.ChallengeIssued) -> list[P.Event]:
    return net.chain.block((who, EscalateChallenge(ch.challenge_id)))


def test_escalation_window_refusals_and_who_may_escalate():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    outsider = next(v for v in EIGHT if v not in ch.committee)
    with pytest.raises(P.NotEscalable, match="escalations open after the reveal window closes"):
        _escalate(net, outsider, ch)
    net.chain.block(("v9", bond(100)))  # bonded, but with no room for escalation_stake (500)
    _revealed(net, ch, {v: net.good(ch) for v in set(ch.committee)})
    assert P.round_result(net.state, ch.challenge_id).verdict == "honest"
    esc = EscalateChallenge(ch.challenge_id)
    # Any bonded account may dispute the verdict, seated or not: it reserves the stake; a repeat is a no-op.
    refused, ev = net.chain.block(("v9", esc), (outsider, esc), (outsider, esc), strict=False)
    assert (
        refused.refusal == "InsufficientFreeBond"
        and "escalation_stake (500); 'v9' has room for 100" in refused.reason
    )
    assert isinstance(ev, P.ChallengeEscalated) and (ev.verifier, ev.stake, ev.disputes) == (
        outsider,
        500,
        "honest",
    )
    assert ev.block == ch.reveal_deadline + 1
    assert net.state.staked == {outsider: 500} and net.state.reserved[outsider] >= 500
    net.chain.advance_to(ch.escalate_deadline)
    events = net.chain.block()  # the round resolves after its window, into the dispute round
    (res,) = of(events, P.ChallengeResolved)
    (dispute,) = of(events, P.ChallengeIssued)
    assert (
        res.verdict == "inconclusive"
        and "escalated to the dispute round by 1 account(s) staking 500" in res.reason
    )
    assert res.rechallenge == dispute.challenge_id and dispute.round == PARAMS.max_rounds
    assert net.state.challenges[ch.challenge_id].pending
    assert net.state.challenges[dispute.challenge_id].escalated == ch.challenge_id
    assert of(events, P.VerifierPaid) == []  # the escalated round's seats wait for the dispute
    with pytest.raises(P.NotEscalable, match="the dispute round is the last word"):
        _escalate(net, outsider, dispute)


def test_a_round_without_a_verdict_cannot_be_escalated_nor_after_its_window():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    one = next(v for v in ch.committee if ch.committee.count(v) == 1)
    _revealed(net, ch, {one: net.good(ch)})  # one revealed seat: below the quorum
    with pytest.raises(P.NotEscalable, match="no verdict to dispute \\(inconclusive"):
        _escalate(net, "v8", ch)
    net2 = Net(EIGHT)
    ch2 = net2.issue()
    net2.open(ch2)
    _revealed(net2, ch2, {v: net2.good(ch2) for v in set(ch2.committee)})
    net2.chain.advance_to(ch2.escalate_deadline)
    with pytest.raises(
        P.NotEscalable, match=f"the escalation window closed at block {ch2.escalate_deadline}"
    ):
        _escalate(net2, "v8", ch2)


def test_a_vindicated_escalation_gets_its_stake_back_and_the_wrong_seats_pay():
    """Round 1's seats agree on a wrong value (fraud); an honest account escalates; the dispute
    round rules honest: the escalator gets its stake back, the escalated round's seats that backed
    another value than the miner's pay outlier_penalty a seat, and the miner is not slashed."""
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    seats1 = {v: ch.committee.count(v) for v in set(ch.committee)}
    _revealed(net, ch, {v: (NOISE, None) for v in seats1})
    assert P.round_result(net.state, ch.challenge_id).verdict == "fraud"
    (esc,) = _escalate(net, "v8", ch)
    assert esc.disputes == "fraud"
    dispute = of(net.chain.advance_to(ch.escalate_deadline + 1), P.ChallengeIssued)[0]
    net.open(dispute)
    bond_before = dict(net.state.vbonds)
    events = net.play(dispute, {v: net.good(dispute) for v in EIGHT})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "honest" and res.challenge_id == dispute.challenge_id
    assert of(events, P.MinerSlashed) == []
    (settled,) = of(events, P.EscalationSettled)
    assert (settled.challenge_id, settled.verifier, settled.returned, settled.forfeited) == (
        ch.challenge_id,
        "v8",
        500,
        0,
    )
    pens = {(e.challenge_id, e.verifier, e.amount) for e in of(events, P.VerifierPenalized)}
    assert pens == {(ch.challenge_id, v, PARAMS.outlier_penalty * k) for v, k in seats1.items()}
    assert net.state.staked == {} and net.state.reserved == {}
    assert not net.state.challenges[ch.challenge_id].pending and net.state.challenges[
        ch.challenge_id
    ].held == dict.fromkeys(seats1, 0)
    # The wrong seats' penalties pay the dispute's winning seats (every seat here).
    pool = [e for e in of(events, P.VerifierPaid) if e.why == "dispute_pool"]
    assert sum(e.amount for e in pool) + sum(e.amount for e in of(events, P.Burned)) == sum(
        a for _, _, a in pens
    )
    assert net.state.vbonds["v8"] >= bond_before["v8"]  # its stake back, and its fee and pool share
    (run_settled,) = of(events, P.RunSettled)
    assert run_settled.stake_released == PARAMS.miner_stake and run_settled.unresolved == 0


def test_a_wrong_escalation_forfeits_its_stake_to_the_dispute_winners():
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    _revealed(net, ch, {v: net.good(ch) for v in set(ch.committee)})
    (esc,) = _escalate(net, "v8", ch)
    assert esc.disputes == "honest"
    dispute = of(net.chain.advance_to(ch.escalate_deadline + 1), P.ChallengeIssued)[0]
    net.open(dispute)
    before = net.state.vbonds["v8"]
    events = net.play(dispute, {v: net.good(dispute) for v in EIGHT})
    (res,) = of(events, P.ChallengeResolved)
    assert res.verdict == "honest"
    (settled,) = of(events, P.EscalationSettled)
    assert (settled.verifier, settled.returned, settled.forfeited) == ("v8", 0, 500)
    assert net.state.slashed.get("v8", 0) == 500
    # The round's seats were right: nobody of it pays.
    assert [e for e in of(events, P.VerifierPenalized) if e.challenge_id == ch.challenge_id] == []
    pool = [e for e in of(events, P.VerifierPaid) if e.why == "dispute_pool"]
    burned = sum(e.amount for e in of(events, P.Burned) if "dispute_pool" in e.why)
    assert sum(e.amount for e in pool) + burned == 500
    seats = {v: dispute.committee.count(v) for v in set(dispute.committee)}
    share = 500 // len(dispute.committee)
    assert {e.verifier: e.amount for e in pool} == {v: share * k for v, k in seats.items()}
    fee_and_share = sum(e.amount for e in of(events, P.VerifierPaid) if e.verifier == "v8")
    assert net.state.vbonds["v8"] == before - 500 + fee_and_share
    assert net.state.staked == {} and net.state.reserved == {}


# --- windows from the replay cost ---------------------------------------------------------------


def test_replay_cost_of_gpt2_small_is_sane():
    spec = Spec.from_toml(REPO_SPECS / "gpt2-small.toml")
    cost = replay_cost(spec, P.ProtocolParams())
    assert 124_000_000 < cost.params < 125_000_000  # GPT-2 small's 124M (vocabulary padded to 50304)
    assert 5e12 < cost.flops < 2e13  # about 6 x 124M x 12 x 1024, plus attention
    assert 3 * 4 * cost.params < cost.bytes < 10 * 4 * cost.params
    assert 600 < float(cost.seconds) < 6000  # tens of minutes at the reference core's speed
    assert cost.blocks == -(-(cost.seconds * 4) // 6)  # ceil(margin x seconds / block_seconds)
    assert cost.blocks <= P.ProtocolParams().max_replay_blocks  # it can register
    tiny = replay_cost(Spec.from_toml(REPO_SPECS / "gpt-tiny.toml"), P.ProtocolParams())
    assert tiny.params < cost.params and tiny.blocks < cost.blocks and tiny.blocks >= 1
    assert cost.as_json()["blocks"] == cost.blocks


def test_the_commit_window_follows_the_replay_cost():
    d = Spec.from_toml(REPO_SPECS / "gpt-tiny.toml").canonical()
    d["steps"] = 8
    spec = Spec.from_dict(d)
    cost = replay_cost(spec, PARAMS)
    assert cost.blocks > 1
    params = dataclasses.replace(PARAMS, commit_window=1)
    run = SyntheticRun()
    chain = PureChain(params)
    chain.block(("miner", run.register(spec=spec.to_cbor(), declared_steps=spec.steps)), ("v1", bond()))
    assert chain.state.runs[run.run_id].replay_blocks == cost.blocks
    chain.block(("miner", run.submit_full_root()))
    (ch,) = chain.block()
    assert ch.commit_deadline - ch.opening_deadline == max(1, cost.blocks)


def test_an_oversize_spec_is_refused_at_registration():
    d = Spec.from_toml(REPO_SPECS / "gpt2-small.toml").canonical()
    d["model"]["n_layer"] = 400
    d["steps"] = 8
    big = Spec.from_dict(d)
    cost = replay_cost(big, P.ProtocolParams())
    assert cost.blocks > P.ProtocolParams().max_replay_blocks
    run = SyntheticRun()
    chain = PureChain(P.ProtocolParams())
    with pytest.raises(
        P.ReplayTooSlow, match=f"{cost.blocks} blocks with the margin; the protocol allows 2400"
    ):
        chain.block(("miner", run.register(spec=big.to_cbor(), declared_steps=8)))
    assert chain.state.runs == {} and chain.state.bonds == {}


# --- snapshots ----------------------------------------------------------------------------------


def _busy_net() -> Net:
    """A state with most fields in use: bonds, unbonding, penalties and burns, fees paid, a refused
    round, a second round whose seats hold reservations, the run's escrow partly spent."""
    net = Net(EIGHT)
    ch = net.issue()
    net.open(ch)
    top = max(sorted(set(ch.committee)), key=ch.committee.count)  # the account of the most seats
    # its seats refuse the opening (a quorum of them); the others commit and never reveal
    net.play(ch, {v: refused_pair(ch.challenge_id) if v == top else None for v in ch.committee})
    (r2,) = [e for e in net.chain.of(P.ChallengeIssued) if e.round == 2]
    net.open(r2)
    good = net.good(r2)
    com, _ = witness(r2.challenge_id, r2.committee[0], good[0])
    net.chain.block((r2.committee[0], com), ("v8", UnbondVerifier(30)))
    return net


def test_snapshots_round_trip_every_field_and_continue_identically():
    net = _busy_net()
    state = net.state
    r2 = [c for c in state.challenges.values() if c.round == 2][0]
    assert state.vbonds and state.unbonding and r2.first and r2.committee and r2.refused_rounds == 1
    run = state.runs[r2.run_id]
    assert run.drawn == 1 and run.replay_blocks >= 1 and 0 < run.escrow_left < run.escrow
    assert (
        state.reserved
        and r2.held
        and state.paid
        and state.burned > 0
        and r2.escalate_deadline > r2.reveal_deadline
    )
    snap = state.to_cbor()
    assert cbor.decode(snap)["version"] == "pot/protocol-state/v3"
    restored = P.ProtocolState.from_cbor(snap)
    assert restored == state
    assert restored.to_cbor() == snap
    twin = PureChain(PARAMS)
    twin.state, twin.number = restored, net.chain.number
    a = [net.chain.block() for _ in range(20)]
    b = [twin.block() for _ in range(20)]
    assert a == b and net.state == twin.state


def test_snapshots_of_older_protocols_are_refused_with_a_clear_message():
    net = _busy_net()
    for old, gone in (("v1", ("vbonds", "unbonding", "reserved", "staked", "disputes", "burned", "paid")),
                      ("v2", ("reserved", "staked", "disputes", "burned", "paid"))):
        d = cbor.decode(net.state.to_cbor())
        d["version"] = f"pot/protocol-state/{old}"
        for k in gone:
            del d[k]
        with pytest.raises(P.SnapshotError, match=f"a pot/protocol-state/{old} snapshot.*this node reads "
                                                  f"pot/protocol-state/v3.*drop the snapshot"):
            P.ProtocolState.from_cbor(cbor.encode(d))
    # A v3 snapshot lacking a field is unusable too, never half-read.
    for k in ("vbonds", "reserved"):
        d = cbor.decode(net.state.to_cbor())
        del d[k]
        with pytest.raises(P.SnapshotError, match="unusable"):
            P.ProtocolState.from_cbor(cbor.encode(d))
    # Escalation stakes are part of the reservations: more staked than reserved is no state the
    # rules can reach. (Reservations may exceed the active bond: a round's seat and a dispute seat
    # share a unit, and the dispute's penalty leaves the round's reservation.)
    d = cbor.decode(net.state.to_cbor())
    account = next(iter(d["reserved"]))
    d["staked"][account] = d["reserved"][account] + 1
    with pytest.raises(P.SnapshotError, match=f"{account!r} has .* staked on escalations but .* reserved"):
        P.ProtocolState.from_cbor(cbor.encode(d))
