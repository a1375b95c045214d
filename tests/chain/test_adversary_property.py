"""Property tests: an adversary over the real protocol state machine (tests/chain/adversary.py).

Hypothesis draws the network (committee size, rounds, quorum, escalation stake), the honest
replayers' bonds, a coalition holding less than half of the whole stake split over accounts, what
the coalition plays, whom a forging miner serves round by round, and (through `rng`) the block of
every call inside its window and the order of each block's calls. Every state the game reaches is
checked (adversary.check_books); at the end:

- an honest miner is never slashed, and its run is never left unresolved;
- a forged step is never judged honest;

each first as stated (whatever the draws), then given that the round that judged against the
truth had an honest seat able to escalate (`why_wrong`): a failure of the second kind is the
protocol judging wrong with an honest majority able to act.

Then: splitting a stake never gains a seat in expectation (challenges.derive), and a dispute round
of more than 1024 seats takes every seat's commitment and reveal in any order.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from chain.protocol import ProtocolParams
from chain.protocol.events import (
    ChallengeIssued,
    ChallengeResolved,
    MinerSlashed,
    RunSettled,
    VerifierPenalized,
    WitnessCommitted,
    WitnessRevealed,
)
from challenges.derive import dispute_seats, draw_committee, seat_units
from commitments.hashing import digest
from tests.chain.adversary import PLAYS, SERVES, Scenario, drain, play, why_wrong
from tests.chain.puretest import PureChain
from tests.chain.runs import SyntheticRun, bond, witness

STAKE = 100  # verifier_stake: one seat unit


@st.composite
def networks(draw) -> ProtocolParams:
    return ProtocolParams(
        commit_window=2, reveal_window=2, opening_deadline=2, challenge_delay=1, escalation_window=2,
        unbonding_delay=5, verifier_stake=STAKE, miner_stake=1000, slash_amount=500,
        challenges_per_run=draw(st.integers(1, 3)),
        committee_size=draw(st.integers(1, 7)),
        max_rounds=draw(st.integers(1, 4)),
        quorum_min_reveals=draw(st.integers(1, 3)),
        escalation_stake=draw(st.sampled_from([100, 200, 500])),
    )


@st.composite
def scenarios(draw, *, forged: bool | None = None) -> Scenario:
    """Honest bonds in whole seat units, at least quorum_min_reveals of them (a network with fewer
    honest seats than the quorum resolves nothing without the coalition); a coalition of less than
    half the whole stake, its bond split any way over accounts (each at least one unit: the first
    bond's minimum)."""
    params = draw(networks())
    honest = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=6)))
    assume(sum(honest) >= params.quorum_min_reveals)
    honest = tuple(k * STAKE for k in honest)
    coalition = list(draw(st.lists(st.integers(STAKE, 12 * STAKE), max_size=6)))
    while sum(coalition) >= sum(honest):
        coalition.pop()
    forged = draw(st.booleans()) if forged is None else forged
    return Scenario(
        params=params, honest=honest, coalition=tuple(coalition), forged=forged,
        play=draw(st.sampled_from((*PLAYS, "mixed"))), escalates=draw(st.booleans()),
        serve=tuple(draw(st.lists(st.sampled_from(SERVES), min_size=1, max_size=4))),
        unbonds=draw(st.booleans()),
    )


def _game(sc: Scenario, rng: random.Random, *, noted: bool = True):
    if noted:
        note(f"scenario: {sc}")
    game = play(sc, rng)
    assert game.honest_refusals == [], f"an honest call was refused: {game.honest_refusals}"
    return game


def _honest_miner_faults(game) -> list[tuple[str, str]]:
    """(why, what) for each slash of the honest miner and each challenge left unresolved."""
    out = [
        (
            why_wrong(game, e.challenge_id),
            f"slashed {e.amount} on round {game.rounds[e.challenge_id].issued.round} "
            f"of challenge {game.rounds[e.challenge_id].issued.index}: {e.reason}",
        )
        for e in game.chain.of(MinerSlashed)
    ]
    for e in game.chain.of(RunSettled):
        if e.unresolved:
            out.append(
                ("judged wrong", f"{e.unresolved} challenge(s) left unresolved: stake locked, escrow burned")
            )
    return out


def _forgery_faults(game) -> list[tuple[str, str]]:
    return [
        (
            why_wrong(game, e.challenge_id),
            f"round {e.round} of challenge {game.rounds[e.challenge_id].issued.index} "
            f"judged honest: {e.reason}",
        )
        for e in game.chain.of(ChallengeResolved)
        if e.verdict == "honest"
    ]


# What the protocol states it cannot do (docs/protocol.md §8): no honest account with the room to
# escalate, or an honest minority of the dispute round's (capped) seats.
RESIDUAL = ("no free bond", "honest minority of the dispute seats")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sc=scenarios(forged=False), rng=st.randoms(use_true_random=False))
def test_an_honest_miner_is_slashed_only_where_no_honest_account_could_afford_to_escalate(sc, rng):
    """The residual the protocol states (docs/protocol.md §8): a captured round stands only when no
    honest account has the escalation room (escalation_stake beyond what its seats may be charged)."""
    faults = _honest_miner_faults(_game(sc, rng))
    assert all(why in RESIDUAL for why, _ in faults), faults


@SETTINGS
@given(sc=scenarios(forged=False), rng=st.randoms(use_true_random=False))
def test_an_honest_miner_is_never_slashed_while_an_honest_account_can_escalate(sc, rng):
    faults = _honest_miner_faults(_game(sc, rng))
    assume(all(why == "judged wrong" for why, _ in faults))
    assert faults == [], faults


@SETTINGS
@given(sc=scenarios(forged=True), rng=st.randoms(use_true_random=False))
def test_a_forged_step_is_judged_honest_only_where_no_honest_account_could_afford_to_escalate(sc, rng):
    faults = _forgery_faults(_game(sc, rng))
    assert all(why in RESIDUAL for why, _ in faults), faults


@SETTINGS
@given(sc=scenarios(forged=True), rng=st.randoms(use_true_random=False))
def test_a_forged_step_is_never_judged_honest_while_an_honest_account_can_escalate(sc, rng):
    faults = _forgery_faults(_game(sc, rng))
    assume(all(why == "judged wrong" for why, _ in faults))
    assert faults == [], faults


@SETTINGS
@given(sc=scenarios(), rng=st.randoms(use_true_random=False))
def test_penalties_reservations_and_units_balance_to_the_end(sc, rng):
    """check_books at every block of the game, then once every account has unbonded and been
    released: nothing is left reserved, and every unit deposited was released or burned."""
    game = _game(sc, rng)
    drain(game)
    s = game.chain.state
    assert s.reserved == {} and s.unbonding == {}
    assert all(b == 0 for b in s.vbonds.values()), s.vbonds


# --- splitting a stake ---------------------------------------------------------------------

bonds_ = st.lists(st.integers(1, 40 * STAKE), min_size=1, max_size=8)


def _accounts(bonds: list[int]) -> list[tuple[str, int]]:
    return [(f"a{i}", b) for i, b in enumerate(bonds)]


def _split(draw, whole: int) -> list[int]:
    cuts = sorted(draw(st.lists(st.integers(0, whole), max_size=5)))
    edges = [0, *cuts, whole]
    return [b - a for a, b in zip(edges, edges[1:], strict=False) if b > a]


def _dispute_expectation(units: list[tuple[str, int]], cap: int) -> dict[str, Fraction]:
    """Each account's expected dispute seats: floor(k cap / U) + (k cap mod U) / U."""
    total = sum(k for _, k in units)
    if total <= cap:
        return {a: Fraction(k) for a, k in units}
    return {a: k * cap // total + Fraction(k * cap % total, total) for a, k in units}


@settings(max_examples=300, deadline=None)
@given(others=bonds_, whole=st.integers(STAKE, 40 * STAKE), data=st.data(), cap=st.integers(1, 64),
       seats=st.integers(1, 20))
def test_splitting_a_stake_never_gains_a_seat_in_expectation(others, whole, data, cap, seats):
    parts = _split(data.draw, whole)
    before = seat_units([*_accounts(others), ("x", whole)], STAKE)
    after = seat_units([*_accounts(others), *[(f"x{i}", b) for i, b in enumerate(parts)]], STAKE)
    mine = lambda units: [a for a, _ in units if a.startswith("x")]  # noqa: E731
    got = lambda units: sum(k for a, k in units if a.startswith("x"))  # noqa: E731
    assert got(after) <= got(before)  # seat units: floors of the parts sum to at most the whole's
    # the dispute lottery, exactly
    e_before, e_after = _dispute_expectation(before, cap), _dispute_expectation(after, cap)
    assert sum(e_after[a] for a in mine(after)) <= sum(e_before[a] for a in mine(before))
    assert sum(e_before.values()) == min(cap, sum(k for _, k in before)) or not before
    # the draw without replacement: an account's expected seats are seats x its units / U (per
    # draw, every unit left is equally likely)
    def e_draw(units):
        total = sum(k for _, k in units)
        return {a: Fraction(k) if total <= seats else Fraction(seats * k, total) for a, k in units}
    d_before, d_after = e_draw(before), e_draw(after)
    assert sum(d_after[a] for a in mine(after)) <= sum(d_before[a] for a in mine(before))


@settings(max_examples=200, deadline=None)
@given(units=st.lists(st.integers(1, 12), min_size=1, max_size=8), cap=st.integers(1, 40),
       seed=st.binary(min_size=32, max_size=32))
def test_the_dispute_lottery_is_systematic_over_the_remainders(units, cap, seed):
    """dispute_seats gives each account its floor and at most one extra seat, cap seats in all, and
    its extras are exactly those of the systematic lottery for one offset o in [0, U): so with o
    uniform (rejection-sampled) each account's extra seat has probability remainder / U."""
    pool = [(f"a{i}", k) for i, k in enumerate(units)]
    total = sum(units)
    got = Counter(dispute_seats(seed, digest("pot/test/cid/v1", seed), pool, cap))
    if total <= cap:
        assert got == Counter(dict(pool))
        return
    floors = {a: k * cap // total for a, k in pool}
    assert sum(got.values()) == cap
    extras = {a for a, _ in pool if got[a] == floors[a] + 1}
    assert all(got[a] in (floors[a], floors[a] + 1) for a, _ in pool)
    ranges, start = {}, 0
    for a, k in sorted(pool):
        ranges[a] = (start, start + k * cap % total)
        start = ranges[a][1]

    def lottery(o):
        return {a for a, (lo, hi) in ranges.items() if any(lo <= o + j * total < hi for j in range(cap + 1))}
    assert any(lottery(o) == extras for o in range(total)), f"extras {extras} match no offset"
    # the exact expectation over o equals floor + remainder / U
    for a, k in pool:
        hits = sum(1 for o in range(total) if a in lottery(o))
        assert Fraction(hits, total) == Fraction(k * cap % total, total)


def test_the_draw_without_replacement_matches_its_expectation_and_splitting_does_not_pay():
    """Over 3000 challenge ids: each account's mean seats within 5 standard errors of
    seats x units / U, and an account split in four holds no more than the whole did."""
    seats, n = 5, 3000
    whole = [("h", 7), ("x", 5), ("y", 3)]
    split = [("h", 7), ("x0", 2), ("x1", 1), ("x2", 1), ("x3", 1), ("y", 3)]
    means = {}
    for name, pool in (("whole", whole), ("split", split)):
        total, tally = sum(k for _, k in pool), Counter()
        for i in range(n):
            cid = digest("pot/test/cid/v1", name, i)
            drawn = draw_committee(digest("pot/test/block/v1", i), cid, pool, seats)
            assert len(drawn) == seats and all(Counter(drawn)[a] <= k for a, k in pool)
            tally.update(drawn)
        for a, k in pool:
            p = Fraction(seats * k, total)
            # hypergeometric variance of seats: s (k/U)(1 - k/U)(U - s)/(U - 1)
            var = seats * (k / total) * (1 - k / total) * (total - seats) / (total - 1)
            assert abs(tally[a] / n - float(p)) <= 5 * (var / n) ** 0.5 + 1e-9, (name, a, tally[a] / n, p)
        means[name] = tally
    assert sum(v for a, v in means["split"].items() if a.startswith("x")) / n <= means["whole"]["x"] / n + 0.1


# --- no cap below the seats ----------------------------------------------------------------

@pytest.mark.slow
def test_every_seat_of_a_1200_seat_dispute_round_commits_and_reveals_in_any_order():
    """1200 accounts bonded verifier_stake each; max_rounds = 1 makes the first round the dispute
    round, which seats every free unit: all 1200 commit, then reveal, in a shuffled order spread
    over the windows, and every call is accepted."""
    n = 1200
    params = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=2, challenge_delay=1,
                            challenges_per_run=1, max_rounds=1, verifier_stake=STAKE, quorum_min_reveals=3)
    chain, run = PureChain(params), SyntheticRun()
    accounts = [f"v{i:04d}" for i in range(n)]
    chain.block(("miner", run.register()), *[(a, bond(STAKE)) for a in accounts])
    chain.block(("miner", run.submit_full_root()))
    chain.advance_to(chain.number + params.challenge_delay)
    (ch,) = chain.of(ChallengeIssued)
    assert sorted(ch.committee) == accounts
    chain.block(("miner", run.opening(ch.challenge_id, ch.step)))
    rng = random.Random(7)
    pairs = {a: witness(ch.challenge_id, a, run.value_hash(ch.step)) for a in accounts}
    for first, last, k in (
        (chain.number + 1, ch.commit_deadline, 0),
        (ch.commit_deadline + 1, ch.reveal_deadline, 1),
    ):
        order = rng.sample(accounts, n)
        blocks = {b: [] for b in range(first, last + 1)}
        for a in order:
            blocks[rng.randint(first, last)].append((a, pairs[a][k]))
        for b, calls in blocks.items():
            chain.advance_to(b - 1)
            chain.block(*calls)  # strict: any refusal raises
    assert len(chain.of(WitnessCommitted)) == n and len(chain.of(WitnessRevealed)) == n
    chain.advance_to(ch.escalate_deadline + 1)
    (res,) = chain.of(ChallengeResolved)
    assert res.verdict == "honest" and res.cluster_size == n and res.outliers == ()


# --- findings: examples the game found, each asserting what should hold (failing while it does not) ----

def _net(**kw) -> ProtocolParams:
    base = dict(commit_window=2, reveal_window=2, opening_deadline=2, challenge_delay=1, escalation_window=2,
                unbonding_delay=5, verifier_stake=STAKE, miner_stake=1000, slash_amount=500)
    return ProtocolParams(**{**base, **kw})


def test_a_minority_that_claims_refusal_twice_does_not_slash_an_honest_miner():
    """Honest 500 (5 units) vs a coalition of 325 (3 units), committee_size 4, 3 challenges: the
    coalition holds 3 of the 4 seats of challenge 0's round 1 and of its reopened round 2 and reveals
    the refused value though it was served. Two refused rounds are fraud unless the honest seat
    escalates the second (the game found this slashing the honest miner while a refused round could
    not be escalated)."""
    sc = Scenario(
        _net(
            challenges_per_run=3, committee_size=4, max_rounds=3, quorum_min_reveals=2, escalation_stake=100
        ),
        honest=(500,),
        coalition=(325,),
        play="refuse",
        escalates=True,
    )
    game = _game(sc, random.Random(72), noted=False)
    assert game.chain.of(MinerSlashed) == [], _honest_miner_faults(game)


def test_a_dispute_round_seats_the_whole_stake_so_a_minority_cannot_win_it():
    """Found by this game against an early v3 core (dispute seats drawn from free units only); a dispute round
    now seats every unit of bond, seats of other rounds included. Honest (100, 500, 800) vs a coalition of
    801, committee_size 3, 3 concurrent challenges, escalation_stake 500. Challenge 0's round 1 seats c0 twice
    and h2 once: fraud; h2 escalates. The dispute round seats only FREE units: h0's unit and h1's and h2's are
    held by the other challenges' rounds, h2's escalated seat is kept reserved and its escalation stake takes
    5 more, so the dispute seats c0 5 times and h1 3 times, and judges the honest miner a fraud (h2 loses its
    escalation stake too)."""
    sc = Scenario(
        _net(
            challenges_per_run=3, committee_size=3, max_rounds=3, quorum_min_reveals=1, escalation_stake=500
        ),
        honest=(100, 500, 800),
        coalition=(801,),
        play="shared",
        escalates=True,
    )
    game = _game(sc, random.Random(1063), noted=False)
    assert game.chain.of(MinerSlashed) == [], _honest_miner_faults(game)


def test_dispute_rounds_run_one_at_a_time_so_none_opens_without_seats():
    """Found by this game against an early v3 core; dispute rounds now queue (state.disputes) and each seats
    the whole stake. Honest (600, 100, 100, 700) vs a coalition (857, 305), committee_size 5, max_rounds 2, 3
    concurrent challenges, escalation_stake 100; the coalition escalates rounds the honest seats won.
    Challenge 0's dispute round takes every free unit (and the coalition wins it 5 seats to 4), so
    challenge 1's dispute round, opened the next block, seats nobody: unresolved, the honest miner's
    stake locked and its escrow burned."""
    sc = Scenario(
        _net(
            challenges_per_run=3, committee_size=5, max_rounds=2, quorum_min_reveals=1, escalation_stake=100
        ),
        honest=(600, 100, 100, 700),
        coalition=(857, 305),
        play="shared",
        escalates=True,
    )
    game = _game(sc, random.Random(1078), noted=False)
    assert [e.committee for e in game.chain.of(ChallengeIssued) if e.round == 2 and not e.committee] == []
    assert _honest_miner_faults(game) == []


def test_a_dispute_round_is_not_left_below_its_quorum_by_concurrent_rounds():
    """Found by this game against an early v3 core; a seat of another round and a dispute seat now share a
    unit of bond. One honest verifier of 200 (2 units), no coalition, committee_size 1, quorum_min_reveals 2,
    max_rounds 2, 2 challenges: each first round seats one unit (below the quorum: re-challenged),
    and each dispute round finds the other unit held by the other challenge: 1 seat, below the
    quorum, unresolved twice: the honest miner's stake is locked and its escrow burned."""
    sc = Scenario(
        _net(
            challenges_per_run=2, committee_size=1, max_rounds=2, quorum_min_reveals=2, escalation_stake=100
        ),
        honest=(200,),
        coalition=(),
    )
    game = _game(sc, random.Random(0), noted=False)
    assert _honest_miner_faults(game) == []


def test_a_forger_that_starves_some_dispute_seats_is_judged_fraud():
    """Found by this game against an early v3 core (refusals set aside under a share); a dispute round now
    judges honest only a miner whose value holds a majority of the revealed seats, refusals counting against
    it. Honest (200, 100) vs a coalition (100, 100) revealing the forger's leaf; max_rounds 1 makes round 1
    the dispute round (5 seats: h0 2, h1, c0, c1). The forger serves c1 and h1 only: h0's 2 refused seats are
    2 of 5 revealed, under dispute_refusal_share 1/2, so refusals are set aside, and the coalition's 2 seats
    beat h1's 1: the forged step is judged honest. (Any coalition above a quarter of the seats wins this way:
    starve s honest seats with h - c < s < (h + c) / 2.)"""
    sc = Scenario(
        _net(
            challenges_per_run=1, committee_size=1, max_rounds=1, quorum_min_reveals=1, escalation_stake=100
        ),
        honest=(200, 100),
        coalition=(100, 100),
        forged=True,
        play="miner",
        serve=("half",),
    )
    game = _game(sc, random.Random(1), noted=False)
    assert sorted(next(iter(game.rounds.values())).served) == ["c1", "h1"]
    assert _forgery_faults(game) == []


def test_a_bond_shrunk_by_penalties_takes_no_round_seat_its_dispute_seats_already_claim():
    """Found by the search above: c0 bonded 301 sat 2 dispute seats; penalties elsewhere left it 101,
    which `reserved` showed free, and a new round seat on it would have owed 150 in all. Its seats
    are bounded by its escalation room too, so every penalty is paid in full (check_books)."""
    params = ProtocolParams(commit_window=2, reveal_window=2, opening_deadline=2, challenges_per_run=3,
                            challenge_delay=1, quorum_min_reveals=1, quorum_share=Fraction(1, 2),
                            committee_size=7, max_rounds=2, unbonding_delay=5, escalation_window=2,
                            escalation_stake=100)
    sc = Scenario(params=params, honest=(600,), coalition=(301,), forged=True, play="withhold_commit",
                  serve=("none",))
    for seed in range(20):
        game = play(sc, random.Random(seed))  # check_books runs after every block
        assert all(ev.amount == 50 * game.rounds[ev.challenge_id].seats[ev.verifier]
                   for ev in game.chain.of(VerifierPenalized))
