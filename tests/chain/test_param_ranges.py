"""Every protocol parameter has a range, and the worst case of all of them stays within 63 bits.

The worst case is computed through the real rules (challenge rounds and their deadlines, unbonding,
penalties, the replay sizing) and the real snapshot encoding, with every parameter at its maximum
and the run's root at the largest block a node follows.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

import chain.protocol as P
from chain.calls import BondVerifier, ConfigureNetwork, UnbondVerifier
from chain.protocol import rules
from chain.protocol.cost import replay_cost
from chain.protocol.params import (
    INT63,
    MAX_BLOCK,
    MAX_BOND,
    MAX_CHALLENGES_PER_RUN,
    MAX_DEADLINE_SPAN,
    MAX_DECLARED_STEPS,
    MAX_DISPUTE_SEATS,
    MAX_QUORUM_TERM,
    MAX_ROUND,
    MAX_VERIFIERS,
    MAX_WINDOW,
    PARAM_RANGES,
    ParamRangeError,
    ProtocolParams,
    deadline_span,
)
from chain.protocol.state import ChallengeState, ProtocolState, RunState
from commitments import cbor
from tests.chain.runs import SyntheticRun

PENALTIES = (
    "no_show_penalty",
    "outlier_penalty",
)  # each at most verifier_stake / 2 (two share a unit of bond)
LARGEST = ProtocolParams(**{name: hi for name, (_, hi) in PARAM_RANGES.items() if name not in PENALTIES},
                         **dict.fromkeys(PENALTIES, PARAM_RANGES["verifier_stake"][1] // 2),
                         quorum_share=Fraction(MAX_QUORUM_TERM - 1, MAX_QUORUM_TERM),
                         forced_challenge_steps=tuple(range(MAX_DECLARED_STEPS - MAX_CHALLENGES_PER_RUN + 1,
                                                            MAX_DECLARED_STEPS + 1)))


class _Block:
    def __init__(self, number: int) -> None:
        self.number, self.hash = number, number.to_bytes(32, "big")


def _record(**changes) -> bytes:
    """The canonical CBOR of the default parameters with `changes`, ranges unchecked."""
    d = ProtocolParams().to_dict()
    d.update(changes)
    return cbor.encode(d)


def _params(name: str, value: int) -> ProtocolParams:
    """The default parameters with `name` at `value`, and the penalties' bound, verifier_stake,
    moved with it (a penalty at its maximum needs the largest stake, the least stake no penalty)."""
    kw = {name: value}
    if name in PENALTIES:
        kw["verifier_stake"] = PARAM_RANGES["verifier_stake"][1]
    elif name == "verifier_stake":
        kw.update(dict.fromkeys(PENALTIES, 0))
    return ProtocolParams(**kw)


@pytest.mark.parametrize("name", sorted(PARAM_RANGES))
def test_each_parameter_is_refused_one_past_its_bounds_naming_it_its_value_and_range(name):
    lo, hi = PARAM_RANGES[name]
    # a penalty's range is 0..MAX_STAKE, but the largest one any parameter set takes is half the
    # largest verifier_stake (test_a_penalty_is_refused_past_half_of_verifier_stake)
    most = PARAM_RANGES["verifier_stake"][1] // 2 if name in PENALTIES else hi
    assert getattr(_params(name, most), name) == most
    assert getattr(_params(name, lo), name) == lo
    for bad in (hi + 1, lo - 1):
        with pytest.raises(
            ParamRangeError, match=rf"protocol parameter {name} must be .* in {lo}\.\."
        ) as err:
            _params(name, bad)
        assert repr(bad) in str(err.value) and (err.value.name, err.value.value) == (name, bad)


@pytest.mark.parametrize("name", PENALTIES)
def test_a_penalty_is_refused_past_half_of_verifier_stake(name):
    """Every penalty is paid in full: a unit of verifier_stake backs a round's seat and a dispute
    seat at once, so the two penalties they may pay must fit in it."""
    kw = dict.fromkeys(PENALTIES, 0)
    assert getattr(ProtocolParams(verifier_stake=71, **{**kw, name: 35}), name) == 35
    with pytest.raises(
        ParamRangeError,
        match=rf"{name} must be a non-negative integer in 0\.\.verifier_stake / 2 "
        rf"\(35\): a unit of bond backs a round's seat and a dispute seat at "
        rf"once, got 36",
    ) as err:
        ProtocolParams(verifier_stake=71, **{**kw, name: 36})
    assert (err.value.name, err.value.hi) == (name, 35)
    # a record goes through the same check
    with pytest.raises(ParamRangeError, match=name):
        ProtocolParams.from_cbor(_record(verifier_stake=70, **{**kw, name: 36}))


@pytest.mark.parametrize("name", ["slash_reward_share", "dispute_honest_share"])
def test_the_v3_shares_are_fractions_in_their_ranges(name):
    zero_ok = name == "slash_reward_share"  # all of a slash may be burned; an honest share of 0 is no rule
    if zero_ok:
        assert getattr(ProtocolParams(**{name: 0}), name) == 0
    else:
        with pytest.raises(ParamRangeError, match=rf"{name} must be a fraction in \(0, 1\]"):
            ProtocolParams(**{name: 0})
    if zero_ok:
        assert getattr(ProtocolParams(**{name: "1"}), name) == 1
    else:  # nothing holds more than every seat: a share of 1 would leave a unanimous dispute no verdict
        with pytest.raises(ParamRangeError, match=rf"{name} must be a fraction in \(0, 1\) "):
            ProtocolParams(**{name: "1"})
        assert getattr(ProtocolParams(**{name: "99/100"}), name) == Fraction(99, 100)
    with pytest.raises(ParamRangeError, match=name):
        ProtocolParams(**{name: Fraction(3, 2)})
    with pytest.raises(ParamRangeError, match=name):
        ProtocolParams(**{name: Fraction(1, 1 << 32)})


def test_the_range_messages_and_the_fraction_and_step_bounds():
    with pytest.raises(ParamRangeError, match=r"opening_deadline must be a positive integer in 1\.\.2\^54, "
                                              r"got 9223372036854775808"):
        ProtocolParams(opening_deadline=1 << 63)
    with pytest.raises(ParamRangeError, match=r"miner_stake must be a non-negative integer in 0\.\.2\^48"):
        ProtocolParams(miner_stake=MAX_BOND + 1)
    with pytest.raises(
        ParamRangeError,
        match=r"quorum_share must be a fraction in \(0, 1\] with a denominator "
        r"of at most 2\^32-1, got '1/4294967296'",
    ):
        ProtocolParams(quorum_share=Fraction(1, 1 << 32))
    with pytest.raises(
        ParamRangeError, match=r"forced_challenge_steps must be steps in 1\.\.100000000, got "
    ):
        ProtocolParams(forced_challenge_steps=(MAX_DECLARED_STEPS + 1,))
    with pytest.raises(ValueError, match="commit_window must be a positive integer, got 'x'"):
        ProtocolParams(commit_window="x")
    assert LARGEST.quorum_share.denominator == MAX_QUORUM_TERM
    # from_dict and from_cbor (a record, a snapshot, a config file) go through the same checks
    with pytest.raises(ParamRangeError, match="challenge_delay"):
        ProtocolParams.from_dict({"challenge_delay": (1 << 64) - 1})
    with pytest.raises(ParamRangeError, match="unbonding_delay"):
        ProtocolParams.from_cbor(_record(unbonding_delay=(1 << 64) - 1))


def test_the_derivation_holds_its_arithmetic():
    assert MAX_ROUND == 9 and sum(range(1, MAX_ROUND + 1)) == 45
    assert MAX_DEADLINE_SPAN == deadline_span() == 145 * MAX_WINDOW + 72 < 1 << 62
    assert MAX_BLOCK + MAX_DEADLINE_SPAN < INT63
    assert MAX_BOND * MAX_VERIFIERS <= 1 << 60 and MAX_BOND * MAX_DISPUTE_SEATS <= 1 << 60
    assert MAX_QUORUM_TERM * MAX_DISPUTE_SEATS < 1 << 44


def test_the_worst_case_deadlines_through_the_rules_stay_within_63_bits_and_the_snapshot():
    """A run whose root lands at MAX_BLOCK, every window at its maximum (its opening window too):
    its last challenge's nine rounds, opened by the real rules one after the other, end within the
    span the derivation gives (which counts an escalation window for every round; the dispute
    rounds, from max_rounds on, have none), and the state holding them round-trips through its
    snapshot."""
    state = ProtocolState(params=LARGEST, head=MAX_BLOCK)
    run_id = b"\x01" * 32
    run = RunState(run_id=run_id, miner="m", registration=bytes(32), spec_digest=bytes(32), mode="value",
                   declared_steps=MAX_DECLARED_STEPS, endpoint="http://m", stake=MAX_BOND,
                   replay_blocks=LARGEST.max_replay_blocks, opening_blocks=LARGEST.max_replay_blocks,
                   root=b"\x02" * 32, size=MAX_DECLARED_STEPS + 1)
    state.runs[run_id] = run
    root_block = MAX_BLOCK
    n = root_block + LARGEST.challenge_delay + (MAX_CHALLENGES_PER_RUN - 1)  # the last first-round draw
    first = None
    for r in range(1, MAX_ROUND + 1):
        cid = r.to_bytes(32, "big")
        (issued,) = rules._open_round(state, run, cid, 0, 1, n, n.to_bytes(32, "big"), round_=r, first=first,
                                      refused_rounds=int(r == MAX_ROUND))
        assert isinstance(issued, P.ChallengeIssued) and issued.round == r
        ch: ChallengeState = state.challenges[cid]
        assert ch.opening_deadline == n + LARGEST.max_replay_blocks * r
        assert ch.reveal_deadline == n + 3 * MAX_WINDOW * r
        dispute = r >= LARGEST.max_rounds
        assert ch.dispute == dispute
        assert ch.escalate_deadline == ch.reveal_deadline + (0 if dispute else LARGEST.escalation_window)
        first = first or cid
        n = ch.escalate_deadline + 1  # the round resolves at the block after its escalation window
    last = n - 1
    disputes = MAX_ROUND - LARGEST.max_rounds + 1  # rounds 8 and 9
    assert last == root_block + MAX_DEADLINE_SPAN - 1 - disputes * MAX_WINDOW and last < INT63
    again = ProtocolState.from_cbor(state.to_cbor())
    assert again.challenges == state.challenges and again.params == LARGEST


def test_the_worst_case_bonds_releases_and_penalties_through_the_rules():
    """Verifiers bonding MAX_BOND at MAX_BLOCK, one unbonding it (its release MAX_BLOCK +
    unbonding_delay), a dispute round seating the others with verifier_stake = MAX_BOND each,
    penalties asked of MAX_BOND per seat on every seat a dispute round can hold, rewards past the
    bond cap burned, and running totals that saturate: every number stays within 63 bits and the
    snapshot round-trips."""
    state = ProtocolState(params=LARGEST, head=MAX_BLOCK - 1)
    for i in range(8):
        events = P.apply_recorded(state, BondVerifier(amount=MAX_BOND), f"v{i}", MAX_BLOCK)
        assert isinstance(events[0], P.VerifierBonded), events
    assert P.apply_recorded(state, BondVerifier(amount=1), "v0", MAX_BLOCK)[0].refusal == "FieldTooLarge"
    (unbonding,) = P.apply_recorded(state, UnbondVerifier(amount=MAX_BOND), "v7", MAX_BLOCK)
    assert unbonding.release_block == MAX_BLOCK + MAX_WINDOW < INT63
    run = RunState(
        run_id=b"\x04" * 32,
        miner="m",
        registration=bytes(32),
        spec_digest=bytes(32),
        mode="value",
        declared_steps=1,
        endpoint="http://m",
        stake=MAX_BOND,
        replay_blocks=LARGEST.max_replay_blocks,
        opening_blocks=LARGEST.max_replay_blocks,
        root=bytes(32),
        size=2,
    )
    state.runs[run.run_id] = run
    cid = b"\x03" * 32
    rules._open_round(
        state, run, cid, 0, 1, MAX_BLOCK, bytes(32), round_=MAX_ROUND, first=None, refused_rounds=1
    )
    ch = state.challenges[cid]
    assert ch.dispute and ch.committee == [f"v{i}" for i in range(7)]  # one unit each; v7 has no bond left
    assert (
        ch.held == {f"v{i}": MAX_BOND for i in range(7)} and state.reserved == {}
    )  # held outside `reserved`
    # Asked for the largest penalty on each of MAX_DISPUTE_SEATS seats (2^59): it pays what its seat holds.
    (taken,) = rules._penalize(
        state, ch, "v0", LARGEST.no_show_penalty * MAX_DISPUTE_SEATS, "no_commit", MAX_BLOCK
    )
    assert taken.amount == MAX_BOND and state.vbonds["v0"] == 0 and ch.held["v0"] == 0
    assert rules._penalize(state, ch, "v0", MAX_BOND, "outlier", MAX_BLOCK) == []  # nothing left to take
    state.slashed["v1"] = INT63 - 1
    rules._penalize(state, ch, "v1", MAX_BOND, "outlier", MAX_BLOCK)
    assert state.slashed["v1"] == INT63  # a running total saturates instead of leaving 63 bits
    # A reward past the bond cap is burned; the burned total saturates.
    state.burned = INT63 - 1
    events = rules._credit(state, cid, "v2", MAX_BOND, "seat_fee", MAX_BLOCK)
    assert [(type(e).__name__, e.amount) for e in events] == [("Burned", MAX_BOND)] and state.burned == INT63
    assert state.vbonds["v2"] == MAX_BOND
    # The stake an account ever bonded is a running total that saturates, kept after it left.
    state.bonds["v9"] = INT63
    P.apply_recorded(state, BondVerifier(amount=MAX_BOND), "v9", MAX_BLOCK)
    assert state.bonds["v9"] == INT63 and state.vbonds["v9"] == MAX_BOND
    assert sum(state.vbonds.values()) + sum(a for w in state.unbonding.values() for _, a in w) <= INT63
    again = ProtocolState.from_cbor(state.to_cbor())
    assert again.unbonding == state.unbonding and again.reserved == state.reserved and again.burned == INT63


def test_the_largest_escrow_is_refused_at_registration_never_stored():
    """With every fee parameter at its maximum, a run's escrow would leave one amount's cap: it is
    refused (EscrowTooLarge) before anything keeps it."""
    from chain.protocol.cost import opening_blocks, run_escrow

    run = SyntheticRun()
    state = ProtocolState(params=LARGEST)
    cost = replay_cost(run.spec, LARGEST)
    assert (
        opening_blocks(run.spec, LARGEST, 1) <= LARGEST.max_replay_blocks
    )  # it would register but for the escrow
    _, escrow = run_escrow(cost.blocks, LARGEST)
    assert escrow > MAX_BOND
    (ev,) = P.apply_recorded(state, run.register(), "miner", 1)
    assert (
        ev.refusal == "EscrowTooLarge"
        and f"would be {escrow} units; one amount is at most {MAX_BOND}" in ev.reason
    )
    assert state.runs == {} and state.bonds == {}


def test_the_replay_sizing_at_its_extremes_stays_exact():
    """The sizing parameters at their maxima (and minima) only scale an exact rational: the largest
    spec the protocol keeps gives a block count that is compared, never stored, when too large."""
    spec = SyntheticRun().spec
    fastest = replay_cost(spec, LARGEST)
    assert fastest.blocks == 1  # the least a run's replay is sized at
    slowest = replay_cost(spec, ProtocolParams(block_seconds=1, reference_flops=1, reference_bytes_per_s=1,
                                               replay_margin=INT63))
    assert slowest.blocks > INT63  # refused at registration: max_replay_blocks is at most 2^54
    assert slowest.blocks > ProtocolParams(max_replay_blocks=MAX_WINDOW).max_replay_blocks


def test_configure_network_refuses_out_of_range_records_with_param_out_of_range():
    state = ProtocolState(params=ProtocolParams(), authority="alice", head=0)
    for changes, named in (({"opening_deadline": 1 << 63}, "opening_deadline"),
                           ({"unbonding_delay": (1 << 64) - 1}, "unbonding_delay"),
                           ({"challenge_delay": (1 << 64) - 1}, "challenge_delay"),
                           ({"miner_stake": 1 << 49}, "miner_stake"),
                           ({"quorum_share": [1, 1 << 33]}, "quorum_share")):
        (ev,) = P.apply_recorded(
            state, ConfigureNetwork(params=_record(**changes), effective_block=5), "alice", 1
        )
        assert isinstance(ev, P.CallRefused) and ev.refusal == "ParamOutOfRange", ev
        assert named in ev.reason
    (ev,) = P.apply_recorded(
        state, ConfigureNetwork(params=ProtocolParams().to_cbor(), effective_block=MAX_BLOCK + 1), "alice", 1
    )
    assert ev.refusal == "ParamOutOfRange" and "effective_block" in ev.reason
    (ev,) = P.apply_recorded(
        state, ConfigureNetwork(params=_record(commit_window="4"), effective_block=5), "alice", 1
    )
    assert ev.refusal == "InvalidCall"  # not a number at all: unusable, not out of range
    assert state.schedule == []
    (ev,) = P.apply_recorded(
        state, ConfigureNetwork(params=LARGEST.to_cbor(), effective_block=MAX_BLOCK), "alice", 1
    )
    assert isinstance(ev, P.NetworkConfigured) and state.schedule[0][0] == MAX_BLOCK
    assert ProtocolState.from_cbor(state.to_cbor()).schedule == state.schedule
