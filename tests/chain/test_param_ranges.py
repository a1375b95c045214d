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

LARGEST = ProtocolParams(**{name: hi for name, (_, hi) in PARAM_RANGES.items()},
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


@pytest.mark.parametrize("name", sorted(PARAM_RANGES))
def test_each_parameter_is_refused_one_past_its_bounds_naming_it_its_value_and_range(name):
    lo, hi = PARAM_RANGES[name]
    assert getattr(ProtocolParams(**{name: hi}), name) == hi
    assert getattr(ProtocolParams(**{name: lo}), name) == lo
    for bad in (hi + 1, lo - 1):
        with pytest.raises(ParamRangeError, match=rf"protocol parameter {name} must be .* in {lo}\.\.") as err:
            ProtocolParams(**{name: bad})
        assert repr(bad) in str(err.value) and (err.value.name, err.value.value) == (name, bad)


def test_the_range_messages_and_the_fraction_and_step_bounds():
    with pytest.raises(ParamRangeError, match=r"opening_deadline must be a positive integer in 1\.\.2\^54, "
                                              r"got 9223372036854775808"):
        ProtocolParams(opening_deadline=1 << 63)
    with pytest.raises(ParamRangeError, match=r"miner_stake must be a non-negative integer in 0\.\.2\^48"):
        ProtocolParams(miner_stake=MAX_BOND + 1)
    with pytest.raises(ParamRangeError, match=r"quorum_share must be a fraction in \(0, 1\] with a denominator "
                                              r"of at most 2\^32-1, got '1/4294967296'"):
        ProtocolParams(quorum_share=Fraction(1, 1 << 32))
    with pytest.raises(ParamRangeError, match=r"forced_challenge_steps must be steps in 1\.\.100000000, got "):
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
    assert MAX_DEADLINE_SPAN == deadline_span() == 136 * MAX_WINDOW + 72 < 1 << 62
    assert MAX_BLOCK + MAX_DEADLINE_SPAN < INT63
    assert MAX_BOND * MAX_VERIFIERS <= 1 << 60 and MAX_BOND * MAX_DISPUTE_SEATS <= 1 << 60
    assert MAX_QUORUM_TERM * MAX_DISPUTE_SEATS < 1 << 44


def test_the_worst_case_deadlines_through_the_rules_stay_within_63_bits_and_the_snapshot():
    """A run whose root lands at MAX_BLOCK, every window at its maximum: its last challenge's nine
    rounds, opened by the real rules one after the other, end exactly at the span the derivation
    gives, and the state holding them round-trips through its snapshot."""
    state = ProtocolState(params=LARGEST, head=MAX_BLOCK)
    run_id = b"\x01" * 32
    run = RunState(run_id=run_id, miner="m", registration=bytes(32), spec_digest=bytes(32), mode="value",
                   declared_steps=MAX_DECLARED_STEPS, endpoint="http://m", stake=MAX_BOND,
                   replay_blocks=LARGEST.max_replay_blocks, root=b"\x02" * 32, size=MAX_DECLARED_STEPS + 1)
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
        assert ch.opening_deadline == n + LARGEST.opening_deadline * r
        assert ch.reveal_deadline == n + 3 * MAX_WINDOW * r
        first = first or cid
        n = ch.reveal_deadline + 1  # the round resolves at the block after its reveal window
    last = n - 1
    assert last == root_block + MAX_DEADLINE_SPAN - 1 and last < INT63
    again = ProtocolState.from_cbor(state.to_cbor())
    assert again.challenges == state.challenges and again.params == LARGEST


def test_the_worst_case_bonds_releases_and_penalties_through_the_rules():
    """Verifiers bonding MAX_BOND at MAX_BLOCK, one unbonding it (its release MAX_BLOCK +
    unbonding_delay), penalties of MAX_BOND per seat on a full dispute committee, and running
    totals that saturate: every number stays within 63 bits and the snapshot round-trips."""
    state = ProtocolState(params=LARGEST, head=MAX_BLOCK - 1)
    for i in range(8):
        events = P.apply_recorded(state, BondVerifier(amount=MAX_BOND), f"v{i}", MAX_BLOCK)
        assert isinstance(events[0], P.VerifierBonded), events
    assert P.apply_recorded(state, BondVerifier(amount=1), "v0", MAX_BLOCK)[0].refusal == "FieldTooLarge"
    (unbonding,) = P.apply_recorded(state, UnbondVerifier(amount=MAX_BOND), "v7", MAX_BLOCK)
    assert unbonding.release_block == MAX_BLOCK + MAX_WINDOW < INT63
    ch = ChallengeState(challenge_id=b"\x03" * 32, run_id=b"\x04" * 32, index=0, step=1, root=bytes(32), size=2,
                        mode="value", issued=MAX_BLOCK, opening_deadline=MAX_BLOCK + 1, commit_deadline=MAX_BLOCK + 2,
                        reveal_deadline=MAX_BLOCK + 3, round=MAX_ROUND, committee=["v0"] * MAX_DISPUTE_SEATS)
    (taken,) = rules._penalize(state, ch, "v0", LARGEST.no_show_penalty * MAX_DISPUTE_SEATS, "no_commit", MAX_BLOCK)
    assert taken.amount == MAX_BOND and state.vbonds["v0"] == 0
    state.slashed["v1"] = INT63 - 1
    rules._penalize(state, ch, "v1", MAX_BOND, "outlier", MAX_BLOCK)
    assert state.slashed["v1"] == INT63  # a running total saturates instead of leaving 63 bits
    state.bonds["v2"] = INT63
    P.apply_recorded(state, UnbondVerifier(amount=1), "v2", MAX_BLOCK)
    P.apply_recorded(state, BondVerifier(amount=1), "v2", MAX_BLOCK)
    assert state.bonds["v2"] == INT63
    assert sum(state.vbonds.values()) + sum(a for w in state.unbonding.values() for _, a in w) <= INT63
    assert ProtocolState.from_cbor(state.to_cbor()).unbonding == state.unbonding


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
        (ev,) = P.apply_recorded(state, ConfigureNetwork(params=_record(**changes), effective_block=5), "alice", 1)
        assert isinstance(ev, P.CallRefused) and ev.refusal == "ParamOutOfRange", ev
        assert named in ev.reason
    (ev,) = P.apply_recorded(state, ConfigureNetwork(params=ProtocolParams().to_cbor(), effective_block=MAX_BLOCK + 1),
                             "alice", 1)
    assert ev.refusal == "ParamOutOfRange" and "effective_block" in ev.reason
    (ev,) = P.apply_recorded(state, ConfigureNetwork(params=_record(commit_window="4"), effective_block=5), "alice", 1)
    assert ev.refusal == "InvalidCall"  # not a number at all: unusable, not out of range
    assert state.schedule == []
    (ev,) = P.apply_recorded(state, ConfigureNetwork(params=LARGEST.to_cbor(), effective_block=MAX_BLOCK), "alice", 1)
    assert isinstance(ev, P.NetworkConfigured) and state.schedule[0][0] == MAX_BLOCK
    assert ProtocolState.from_cbor(state.to_cbor()).schedule == state.schedule
