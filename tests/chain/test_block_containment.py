"""Containment of a block's own protocol work (on_block): a stage that fails inside the protocol
for one item is undone and recorded as BlockWorkFailed, the other items go on, the cursor advances,
and every follower derives the same state, byte for byte."""

from __future__ import annotations

import pytest

from chain import protocol as P
from chain import view as view_module
from chain.dev import DevTransport
from chain.protocol import rules
from chain.protocol.events import BlockWorkFailed
from chain.transport import Block
from chain.view import ChainView
from tests.chain.runs import SyntheticRun, bond

PARAMS = P.ProtocolParams(challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2,
                          challenges_per_run=1, quorum_min_reveals=1, forced_challenge_steps=(3,))


def _two_runs(path) -> tuple[DevTransport, SyntheticRun, SyntheticRun]:
    """Two runs of one miner whose challenges are issued in the same block and, never opened,
    resolve in the same block (fraud), then a few empty blocks. The verifier's bond backs both
    committees (committee_size seat units each, reserved while the rounds are open)."""
    a, b = SyntheticRun(steps=4, seed="run-a"), SyntheticRun(steps=4, seed="run-b")
    miner = DevTransport(path, "miner")
    miner.record_params(PARAMS)
    DevTransport(path, "v1").submit([bond(PARAMS.verifier_stake * 2 * PARAMS.committee_size)])
    miner.submit([a.register(), b.register()])
    miner.submit([a.submit_full_root(), b.submit_full_root()])
    for _ in range(8):
        miner.seal()
    return miner, a, b


def _follow(path, account: str = "observer") -> ChainView:
    view = ChainView(DevTransport(path, account), PARAMS)
    view.sync()
    return view


def _challenge_of(view: ChainView, run: SyntheticRun) -> P.ChallengeState:
    (ch,) = [c for c in view.state.challenges.values() if c.run_id == run.run_id]
    return ch


def test_a_resolution_that_fails_halfway_is_undone_and_the_others_resolve(tmp_path, monkeypatch):
    miner, a, b = _two_runs(tmp_path / "c.db")
    real = rules._resolve

    def poisoned(state, ch, n, block_hash):
        out = real(state, ch, n, block_hash)  # every change of the resolution made, then a crash
        if ch.run_id == a.run_id:
            raise RuntimeError("secret value 1234")
        return out

    monkeypatch.setattr(rules, "_resolve", poisoned)
    one, two = _follow(tmp_path / "c.db", "v1"), _follow(tmp_path / "c.db")
    assert one.cursor == two.cursor == miner.finalized_head()
    failed = one.of(BlockWorkFailed)
    ch_a, ch_b = _challenge_of(one, a), _challenge_of(one, b)
    assert failed and {(e.stage, e.subject, e.error_type) for e in failed} == {
        ("resolution", ch_a.challenge_id.hex(), "RuntimeError")}
    # Still due, it is tried again at every block; the record never carries the exception's text.
    assert [e.block for e in failed] == list(range(failed[0].block, miner.finalized_head() + 1))
    assert all("1234" not in e.to_json() for e in failed)
    assert ch_a.verdict is None and ch_b.verdict == "fraud"
    # A's seats still hold their collateral (the undone resolution freed nothing), B's are free again.
    assert one.state.reserved == {"v1": PARAMS.verifier_stake * PARAMS.committee_size} == ch_a.held
    assert one.state.runs[b.run_id].settled and not one.state.runs[a.run_id].settled
    assert one.state.runs[a.run_id].slashed == 0 and one.state.runs[b.run_id].slashed == PARAMS.slash_amount
    assert one.state.slashed == {"miner": PARAMS.slash_amount}
    # Two followers agree byte for byte, events included.
    assert one.state.to_cbor() == two.state.to_cbor()
    assert [e.to_json() for e in one.events] == [e.to_json() for e in two.events]

    # Undone exactly: the state is the one of a follower whose resolution of A did nothing at all.
    monkeypatch.setattr(
        rules, "_resolve", lambda s, ch, n, h: [] if ch.run_id == a.run_id else real(s, ch, n, h)
    )
    assert _follow(tmp_path / "c.db").state.to_cbor() == one.state.to_cbor()

    # Once the fault is gone, the challenge resolves at the next block like the other one did.
    monkeypatch.setattr(rules, "_resolve", real)
    miner.seal()
    one.sync()
    assert one.state.reserved == {} and one.state.runs[a.run_id].settled
    assert _challenge_of(one, a).verdict == "fraud" and not [
        e for e in one.events if e.block > failed[-1].block and isinstance(e, BlockWorkFailed)
    ]


def test_an_issuance_that_fails_leaves_the_other_runs_challenged(tmp_path, monkeypatch):
    miner, a, b = _two_runs(tmp_path / "c.db")
    real = rules._issue_first

    def poisoned(state, run, n, block_hash):
        if run.run_id == a.run_id:
            run.drawn += 1  # half-applied: undone by the savepoint
            raise KeyError("no such thing")
        return real(state, run, n, block_hash)

    monkeypatch.setattr(rules, "_issue_first", poisoned)
    view = _follow(tmp_path / "c.db")
    assert view.cursor == miner.finalized_head()
    assert [c.run_id for c in view.state.challenges.values()] == [b.run_id]
    assert view.state.runs[a.run_id].drawn == 0 and view.state.runs[a.run_id].challenges == []
    failed = view.of(BlockWorkFailed)
    assert failed and {(e.stage, e.subject, e.error_type) for e in failed} == {
        ("issuance", a.run_id.hex(), "KeyError")}


def test_a_parameter_record_that_fails_is_dropped_and_the_next_one_applies():
    state = P.new_state(PARAMS)
    bad, good = P.ProtocolParams(commit_window=9).to_dict(), P.ProtocolParams(commit_window=7).to_dict()
    bad["commit_window"] = "nine"  # a record no node can apply (a state only a bug could make)
    state.schedule = [[2, 1, bad], [2, 1, good]]
    events = rules.on_block(state, Block(2, bytes(32)))
    assert [type(e).__name__ for e in events] == ["BlockWorkFailed", "ParamsEffective"]
    assert (events[0].stage, events[0].error_type) == ("activation", "ValueError")
    assert state.params.commit_window == 7 and state.schedule == [] and state.configured_at == 1


def test_a_release_that_fails_for_one_account_releases_the_others(monkeypatch):
    state = P.new_state(PARAMS)
    state.verifiers = ["v1", "v2"]
    state.unbonding = {"v1": [[3, 40]], "v2": [[3, 60]]}
    real = rules._release_account

    def poisoned(state_, account, n):
        if account == "v1":
            state_.unbonding["v1"][0][1] = 0  # half-applied: undone
            raise ZeroDivisionError
        return real(state_, account, n)

    monkeypatch.setattr(rules, "_release_account", poisoned)
    events = rules.on_block(state, Block(3, bytes(32)))
    assert [(type(e).__name__, getattr(e, "verifier", getattr(e, "subject", None))) for e in events] == [
        ("BlockWorkFailed", "v1"), ("BondReleased", "v2")]
    assert state.unbonding == {"v1": [[3, 40]]}  # still waiting, tried again at the next block
    monkeypatch.setattr(rules, "_release_account", real)
    assert [e.amount for e in rules.on_block(state, Block(4, bytes(32)))] == [40] and state.unbonding == {}


def test_a_stage_whose_selection_fails_ends_for_the_block_and_the_next_stage_runs(monkeypatch):
    state = P.new_state(PARAMS)
    state.verifiers, state.unbonding = ["v1"], {"v1": [[3, 40]]}

    def broken(*_a, **_k):
        raise TypeError("selection bug")

    monkeypatch.setattr(rules, "_release_due", broken)
    events = rules.on_block(state, Block(3, bytes(32)))
    assert [(e.stage, e.subject, e.error_type) for e in events] == [("release", "", "TypeError")]
    assert state.head == 3


def test_the_view_contains_a_block_whose_whole_work_fails(tmp_path, monkeypatch):
    miner, _, _ = _two_runs(tmp_path / "c.db")

    def broken(state, block):
        raise AssertionError("never raised by on_block, which contains its items")

    monkeypatch.setattr(view_module, "on_block", broken)
    view = _follow(tmp_path / "c.db")
    assert view.cursor == miner.finalized_head()
    failed = view.of(BlockWorkFailed)
    assert len(failed) == miner.finalized_head() and {e.stage for e in failed} == {"block"}
    assert len(view.state.runs) == 2  # the calls of every block still applied


def test_on_block_still_refuses_a_block_at_or_before_its_head():
    state = P.new_state(PARAMS)
    rules.on_block(state, Block(3, bytes(32)))
    with pytest.raises(ValueError, match="not after the last processed block 3"):
        rules.on_block(state, Block(3, bytes(32)))
