"""Unit tests of the protocol state machine: every transition and every refusal."""

from __future__ import annotations

import copy
import dataclasses
import json
from fractions import Fraction

import pytest

from chain import protocol as P
from chain.calls import CommitWitness, DeclareWitnessNormBucket, RevealWitnessValue, SubmitCheckpointRoot
from challenges.derive import challenge_id, challenge_step_at, draw_committee
from commitments import merkle
from commitments.hashing import digest
from tests.chain.puretest import PureChain
from tests.chain.runs import SyntheticRun, bond, proof, witness

# One challenge per run, so each test follows one challenge (test_protocol_rounds covers several).
PARAMS = P.ProtocolParams(commit_window=5, reveal_window=5, opening_deadline=5, challenge_delay=2,
                          challenges_per_run=1, quorum_min_reveals=3, miner_stake=1000, verifier_stake=100,
                          slash_amount=400)
VERIFIERS = ("v1", "v2", "v3")  # bonded before any challenge: the committee of every challenge here


def registered(params=PARAMS, run=None, verifiers=VERIFIERS, units=1):
    """A registered run, and `verifiers` bonded in the same block, `units` seats' collateral each
    (one unit, verifier_stake, is the least bond; a seat reserves one for its round's life)."""
    chain, run = PureChain(params), run or SyntheticRun()
    chain.block(("miner", run.register()), *[(v, bond(params.verifier_stake * units)) for v in verifiers])
    return chain, run


def challenged(params=PARAMS, run=None):
    """A run whose full root is on chain and whose challenge has been issued."""
    chain, run = registered(params, run)
    chain.block(("miner", run.submit_full_root()))
    chain.advance_to(chain.number + params.challenge_delay)
    (issued,) = chain.of(P.ChallengeIssued)
    return chain, run, issued


# --- registration --------------------------------------------------------------------------


def test_register_run():
    chain, run = registered(verifiers=())
    (ev,) = chain.events
    assert isinstance(ev, P.RunRegistered)
    assert ev.run_id == run.run_id and ev.miner == "miner" and ev.mode == "value"
    assert ev.spec_digest == run.spec.digest() and ev.declared_steps == 8 and ev.stake == 1000
    assert chain.state.bonds == {"miner": 1000}
    assert chain.state.runs[run.run_id].replay_blocks >= 1


def test_run_id_belongs_to_its_sender():
    chain, run = PureChain(PARAMS), SyntheticRun()
    # A registration copied by another account names a run id derived from the miner, not from it.
    with pytest.raises(P.RunIdNotOwned, match="derive_run_id\\('v1', nonce\\)"):
        chain.block(("v1", run.register()))
    with pytest.raises(P.RunIdNotOwned):
        chain.block(("miner", run.register(nonce=bytes(16))))
    assert chain.state.runs == {}
    thief = SyntheticRun(miner="v1")  # the same seed and nonce, its own run id
    assert thief.run_id != run.run_id
    chain.block(("v1", thief.register()), ("miner", run.register()))
    assert {r.miner for r in chain.state.runs.values()} == {"v1", "miner"}


def test_register_is_idempotent_and_conflicts_refused():
    chain, run = registered()
    before = copy.deepcopy(chain.state)
    assert chain.block(("miner", run.register())) == []
    assert chain.state.runs == before.runs and chain.state.bonds == before.bonds
    with pytest.raises(P.RunExists, match="different commitments"):
        chain.block(("miner", run.register(endpoint="http://elsewhere")))
    with pytest.raises(P.RunExists, match="registered by 'miner'"):  # checked before the run id's owner
        chain.block(("v1", run.register()))


def test_register_refuses_bad_spec_and_steps():
    chain, run = PureChain(PARAMS), SyntheticRun()
    with pytest.raises(P.InvalidCall, match="spec is not usable"):
        chain.block(("miner", run.register(spec=b"\xa1\x61x\x01")))
    with pytest.raises(P.InvalidCall, match="declared_steps"):
        chain.block(("miner", run.register(declared_steps=9)))
    from commitments import cbor
    partial = cbor.encode({"steps": 8})
    with pytest.raises(P.InvalidCall, match="canonical CBOR form"):
        chain.block(("miner", run.register(spec=partial)))
    assert chain.state.runs == {}


def _tiny_spec():
    from pathlib import Path

    from commitments.spec import Spec

    d = Spec.from_toml(
        Path(__file__).resolve().parents[2] / "examples" / "specs" / "gpt-tiny.toml"
    ).canonical()
    d["steps"] = 8
    return Spec.from_dict(d)


def test_the_opening_window_follows_the_checkpoint_interval():
    """A miner that keeps a state every k steps regenerates up to k - 1 steps before it can open
    one: the run's opening window is sized for that, and a window past max_replay_blocks is refused."""
    from chain.protocol.cost import opening_blocks

    spec = _tiny_spec()
    params = dataclasses.replace(PARAMS, challenge_delay=1)
    assert opening_blocks(spec, params, 1) == params.opening_deadline  # never less than the network's
    window = opening_blocks(spec, params, 10)
    assert window > params.opening_deadline
    chain, run = PureChain(params), SyntheticRun()
    (reg, _, _, _) = chain.block(("miner", run.register(spec=spec.to_cbor(), checkpoint_interval=10)),
                                 *[(v, bond(100)) for v in VERIFIERS])
    assert (reg.checkpoint_interval, reg.opening_blocks) == (10, window)
    chain.block(("miner", run.submit_full_root()))
    (ch,) = chain.block()
    assert ch.opening_deadline == ch.block + window
    too_long = 10_000
    big = opening_blocks(spec, params, too_long)
    assert big > params.max_replay_blocks
    other = SyntheticRun(seed="run-b")
    with pytest.raises(
        P.CheckpointIntervalTooLong,
        match=f"kept every {too_long} steps needs an opening window of "
        f"{big} blocks .* allows {params.max_replay_blocks}: keep a "
        f"state at least every {too_long * 2400 // big} steps",
    ):
        chain.block(("miner", other.register(spec=spec.to_cbor(), checkpoint_interval=too_long)))
    assert other.run_id not in chain.state.runs


def test_the_escrow_is_sized_at_registration_and_capped():
    """The miner escrows a seat fee for every seat of every round below the dispute round of each
    challenge; an escrow past one amount's cap (MAX_BOND) is refused."""
    from chain.protocol.cost import seats_below_dispute
    from chain.protocol.params import MAX_BOND

    chain, run = registered()
    r = chain.state.runs[run.run_id]
    assert r.seat_fee == PARAMS.fee_per_replay_block * r.replay_blocks
    assert seats_below_dispute(PARAMS) == 5 + 10  # committee_size 5, doubled once, max_rounds 3
    assert r.escrow == r.escrow_left == r.seat_fee * PARAMS.challenges_per_run * 15
    assert chain.of(P.RunRegistered)[0].escrow == r.escrow
    most = MAX_BOND // (r.replay_blocks * PARAMS.challenges_per_run * 15)
    ok = PureChain(dataclasses.replace(PARAMS, fee_per_replay_block=most))
    assert isinstance(ok.block(("miner", run.register()))[0], P.RunRegistered)
    over = PureChain(dataclasses.replace(PARAMS, fee_per_replay_block=most + 1))
    with pytest.raises(P.EscrowTooLarge, match=f"one amount is at most {MAX_BOND}"):
        over.block(("miner", run.register()))
    assert over.state.runs == {}


def test_cross_architecture_spec_uses_buckets():
    chain, _ = registered(run=SyntheticRun(profile="torch-native"))
    assert chain.of(P.RunRegistered)[0].mode == "bucket"


# --- roots ---------------------------------------------------------------------------------


def test_roots_append_only():
    chain, run = registered()
    (ev,) = chain.block(("miner", run.submit_root(3)))
    assert ev.size == 3 and not ev.complete and ev.challenges_at is None
    (ev,) = chain.block(("miner", run.submit_root(6, 3)))
    assert ev.root == run.root(6)
    assert chain.block(("miner", run.submit_root(6, 3))) == []  # identical repeat
    (ev,) = chain.block(("miner", run.submit_root(9, 6)))
    assert ev.complete and ev.challenges_at == chain.number + PARAMS.challenge_delay


@pytest.mark.parametrize(
    "make, refusal, reason",
    [
        (lambda r: SubmitCheckpointRoot(digest("pot/x", 1), r.root(3), 3, []), P.UnknownRun, "no run"),
        (
            lambda r: dataclasses.replace(r.submit_root(5, 3), consistency_proof=[]),
            P.BadConsistencyProof,
            "prefix",
        ),
        (
            lambda r: SubmitCheckpointRoot(r.run_id, r.root(5), 5, merkle.consistency_proof(r.leaves[:5], 2)),
            P.BadConsistencyProof,
            "prefix",
        ),
        (lambda r: r.submit_root(2), P.RootNotAppendOnly, "smaller"),
        (lambda r: SubmitCheckpointRoot(r.run_id, r.root(4), 3, []), P.RootNotAppendOnly, "rewrites"),
        (lambda r: SubmitCheckpointRoot(r.run_id, r.root(9), 10, []), P.BadRootSize, "outside 1..9"),
    ],
)
def test_root_refusals(make, refusal, reason):
    chain, run = registered()
    chain.block(("miner", run.submit_root(3)))
    before = copy.deepcopy(chain.state.runs)
    with pytest.raises(refusal, match=reason):
        chain.block(("miner", make(run)))
    assert chain.state.runs == before


def test_root_refusals_owner_and_first_proof():
    chain, run = registered()
    with pytest.raises(P.NotRunOwner, match="belongs to 'miner'"):
        chain.block(("v1", run.submit_root(3)))
    with pytest.raises(P.BadConsistencyProof, match="first root"):
        chain.block(("miner", SubmitCheckpointRoot(run.run_id, run.root(3), 3, [run.root(1)])))
    with pytest.raises(P.BadRootSize):
        chain.block(("miner", SubmitCheckpointRoot(run.run_id, run.root(1), 0, [])))


# --- issuance ------------------------------------------------------------------------------


def test_challenges_issued_one_per_block_from_later_blocks():
    # Ten seat units a verifier: three concurrent committees of committee_size (5) seats fit in the
    # 30 units, each drawn without replacement from the units the earlier ones left free.
    params = P.ProtocolParams(challenges_per_run=3, challenge_delay=2)
    chain, run = registered(params, units=10)
    chain.block(("miner", run.submit_full_root()))
    root_block = chain.number
    assert chain.block() == []  # delay not yet over
    evs = [chain.block() for _ in range(3)]
    assert [[type(e) for e in b] for b in evs] == [[P.ChallengeIssued]] * 3
    issued = [b[0] for b in evs]
    taken = []
    free = dict.fromkeys(VERIFIERS, 10)  # seat units not yet reserved by an open round
    for i, e in enumerate(issued):
        # Challenge i is drawn from the hash of its own block, root_block + delay + i.
        block = root_block + 2 + i
        block_hash = digest("pot/test/block/v1", block)
        assert e.block == block and e.index == i and e.round == 1 and e.first is None
        assert e.step == challenge_step_at(block_hash, run.run_id, run.root(9), 9, i, taken)
        assert e.challenge_id == challenge_id(run.run_id, run.root(9), 9, i, block_hash)
        # committee_size seats drawn from the free units of the bonded verifiers, the miner never
        assert list(e.committee) == draw_committee(block_hash, e.challenge_id, sorted(free.items()), 5)
        assert len(e.committee) == 5 and set(e.committee) <= set(VERIFIERS)
        for v in e.committee:
            free[v] -= 1
        taken.append(e.step)
    # every seat reserved its collateral: what the three open rounds hold
    assert chain.state.reserved == {v: (10 - free[v]) * 100 for v in VERIFIERS if free[v] < 10}
    assert len(set(taken)) == 3
    e = issued[0]
    replay = chain.state.runs[run.run_id].replay_blocks
    assert e.opening_deadline == e.block + 4
    assert (
        e.commit_deadline == e.opening_deadline + max(4, replay)
        and e.reveal_deadline == e.commit_deadline + 4
    )
    assert e.endpoint == run.endpoint and e.mode == "value" and e.size == 9
    later = chain.advance_to(chain.number + 3)
    assert not [e for e in later if isinstance(e, P.ChallengeIssued)]  # three challenges, no more


def test_a_challenge_waits_for_free_seat_units():
    """Three verifiers of one unit each: the first challenge seats all three units (fewer units than
    committee_size: every unit sits), and the second is drawn only once the first round is settled
    and its units are free again; its turn does not pass meanwhile."""
    params = dataclasses.replace(PARAMS, challenges_per_run=2, challenge_delay=1)
    chain, run = registered(params)
    chain.block(("miner", run.submit_full_root()))
    chain.block()
    (first,) = chain.of(P.ChallengeIssued)
    assert first.committee == VERIFIERS and chain.state.reserved == dict.fromkeys(VERIFIERS, 100)
    assert P.eligible_verifiers(chain.state, exclude="miner") == []  # nothing free to seat
    chain.advance_to(first.opening_deadline)  # no opening: the round resolves at the block after it
    assert chain.of(P.ChallengeIssued) == [first]
    # Issuance runs before resolution in a block: the block that settles the first round frees
    # its units, and the second challenge is drawn at the next one.
    events = chain.block()
    (res,) = [e for e in events if isinstance(e, P.ChallengeResolved)]
    assert res.verdict == "fraud" and not [e for e in events if isinstance(e, P.ChallengeIssued)]
    assert chain.state.reserved == {}
    (second,) = chain.block()
    assert isinstance(second, P.ChallengeIssued) and second.index == 1 and second.committee == VERIFIERS
    assert chain.state.reserved == dict.fromkeys(VERIFIERS, 100)


def test_forced_step():
    _, _, issued = challenged(P.ProtocolParams(forced_challenge_steps=(7,), challenge_delay=1))
    assert issued.step == 7


# --- openings ------------------------------------------------------------------------------


def test_opening_accepted_and_idempotent():
    chain, run, ch = challenged()
    (ev,) = chain.block(("miner", run.opening(ch.challenge_id, ch.step)))
    assert isinstance(ev, P.OpeningSubmitted) and ev.leaf == run.leaves[ch.step]
    assert ev.leaf_hash == run.value_hash(ch.step)
    assert chain.block(("miner", run.opening(ch.challenge_id, ch.step))) == []


def test_opening_refusals():
    chain, run, ch = challenged()
    cid = ch.challenge_id
    other = 1 if ch.step != 1 else 2
    with pytest.raises(P.UnknownChallenge):
        chain.block(("miner", run.opening(digest("pot/x", 0), ch.step)))
    with pytest.raises(P.NotRunOwner):
        chain.block(("v1", run.opening(cid, ch.step)))
    bad = run.opening(cid, ch.step, leaf=run.leaves[other])  # a real leaf, wrong position
    with pytest.raises(P.BadLeafProof, match=f"index {ch.step}"):
        chain.block(("miner", bad))
    chain.advance_to(ch.opening_deadline - 2)
    chain.block(("miner", run.opening(cid, ch.step)))
    assert chain.number == ch.opening_deadline - 1
    with pytest.raises(P.AlreadyOpened):  # still in time, but a second, different opening
        chain.block(("miner", dataclasses.replace(run.opening(cid, ch.step), uri="http://other")))


def test_opening_after_deadline_refused_and_missing_opening_is_fraud():
    chain, run, ch = challenged()
    chain.advance_to(ch.opening_deadline)
    with pytest.raises(P.OpeningTooLate, match=f"due by block {ch.opening_deadline}"):
        chain.block(("miner", run.opening(ch.challenge_id, ch.step)))
    resolved = chain.of(P.ChallengeResolved)
    assert len(resolved) == 1 and resolved[0].verdict == "fraud" and "no opening" in resolved[0].reason
    (slash,) = chain.of(P.MinerSlashed)
    assert slash.amount == 400 and slash.miner == "miner"
    assert chain.state.slashed == {"miner": 400}


def _forced_five(run):
    params = P.ProtocolParams(forced_challenge_steps=(5,), challenge_delay=1)
    chain, run = registered(params, run)
    chain.block(("miner", run.submit_full_root()))
    chain.block()
    (ch,) = chain.of(P.ChallengeIssued)
    assert ch.step == 5
    return chain, ch


def test_leaf_that_is_not_a_step_leaf():
    run = SyntheticRun()
    run.leaves[5] = b"not a step leaf"
    chain, ch = _forced_five(run)
    with pytest.raises(P.BadLeaf, match="not a step leaf"):
        chain.block(("miner", run.opening(ch.challenge_id, 5)))


def test_leaf_of_another_step_at_the_index():
    run = SyntheticRun()
    run.leaves[5] = run.leaves[4]  # included at index 5, but says step 4
    chain, ch = _forced_five(run)
    with pytest.raises(P.BadLeaf, match="says step 4"):
        chain.block(("miner", run.opening(ch.challenge_id, 5)))


# --- witnesses -----------------------------------------------------------------------------


def opened(params=PARAMS, run=None):
    chain, run, ch = challenged(params, run)
    chain.block(("miner", run.opening(ch.challenge_id, ch.step)))
    return chain, run, ch


def test_commit_and_refusals():
    chain, run, ch = opened()
    com, _ = witness(ch.challenge_id, "v1", run.value_hash(ch.step))
    (ev,) = chain.block(("v1", com))
    assert isinstance(ev, P.WitnessCommitted) and ev.verifier == "v1" and ev.commitment == com.commitment
    assert chain.state.bonds["v1"] == 100  # bonded by bond_verifier, not by the commit
    assert chain.block(("v1", com)) == []  # identical repeat
    with pytest.raises(P.AlreadyCommitted):
        chain.block(("v1", CommitWitness(ch.challenge_id, digest("pot/x", 2))))
    with pytest.raises(P.OwnChallenge):
        chain.block(("miner", com))
    with pytest.raises(P.UnknownChallenge):
        chain.block(("v2", CommitWitness(digest("pot/x", 3), digest("pot/x", 2))))
    # Bonding after the draw does not seat an account on the challenge's committee.
    chain.block(("v4", bond(100)))
    with pytest.raises(P.NotInCommittee, match="'v4' does not sit on the committee"):
        chain.block(("v4", witness(ch.challenge_id, "v4", run.value_hash(ch.step))[0]))
    assert "v4" not in chain.state.challenges[ch.challenge_id].commitments
    chain.advance_to(ch.commit_deadline)
    with pytest.raises(P.CommitWindowClosed, match=f"closed at block {ch.commit_deadline}"):
        chain.block(("v2", witness(ch.challenge_id, "v2", run.value_hash(ch.step))[0]))


def test_commit_needs_a_seat_and_the_opening_on_chain():
    chain, run, ch = challenged()
    com, _ = witness(ch.challenge_id, "v1", run.value_hash(ch.step))
    # Nothing to replay yet: a seated account's commitment waits for the opening.
    with pytest.raises(P.NoOpening, match="has no opening on chain yet"):
        chain.block(("v1", com))
    assert chain.state.challenges[ch.challenge_id].commitments == {}
    # An unseated account is told it has no seat, opening or not.
    chain.block(("v4", bond(100)))
    with pytest.raises(P.NotInCommittee):
        chain.block(("v4", witness(ch.challenge_id, "v4", run.value_hash(ch.step))[0]))
    chain.block(("miner", run.opening(ch.challenge_id, ch.step)))
    (ev,) = chain.block(("v1", com))
    assert isinstance(ev, P.WitnessCommitted)
    events = chain.block(("v2", witness(ch.challenge_id, "v2", run.value_hash(ch.step))[0]),
                         ("v4", witness(ch.challenge_id, "v4", run.value_hash(ch.step))[0]), strict=False)
    assert [type(e) for e in events] == [P.WitnessCommitted, P.CallRefused]
    assert events[1].refusal == "NotInCommittee"


def test_reveal_refusals():
    chain, run, ch = opened()
    value = run.value_hash(ch.step)
    com, rev = witness(ch.challenge_id, "v1", value)
    with pytest.raises(P.NoCommitment):
        chain.block(("v1", rev))
    chain.block(("v1", com))
    with pytest.raises(P.RevealTooEarly, match=str(ch.commit_deadline)):
        chain.block(("v1", rev))
    chain.advance_to(ch.commit_deadline)
    # Wrong salt: refused, and the rejection is recorded both in the event and in the state.
    wrong = RevealWitnessValue(ch.challenge_id, value, proof(ch.challenge_id), 0, b"\x00" * 32)
    with pytest.raises(P.CommitmentMismatch) as err:
        chain.block(("v1", wrong))
    (rej,) = err.value.events
    assert isinstance(rej, P.RevealRejected) and rej.verifier == "v1"
    assert chain.state.challenges[ch.challenge_id].rejected[0][1] == "v1"
    events = chain.block(("v1", wrong), strict=False)
    assert [type(e) for e in events] == [P.RevealRejected, P.CallRefused]
    assert events[1].refusal == "CommitmentMismatch"
    # The right value with another proof half does not open the commitment either.
    with pytest.raises(P.CommitmentMismatch):
        chain.block(("v1", dataclasses.replace(rev, proof_hash=digest("pot/other-proof", 1))))
    (ev,) = chain.block(("v1", rev))
    assert isinstance(ev, P.WitnessRevealed) and ev.value_hash == value
    assert ev.proof_hash == proof(ch.challenge_id) and ev.norm_bucket == 0
    assert chain.state.challenges[ch.challenge_id].reveals["v1"] == [value, 0, proof(ch.challenge_id)]
    assert chain.block(("v1", rev)) == []
    chain.advance_to(ch.reveal_deadline)
    com2, rev2 = witness(ch.challenge_id, "v2", value)
    with pytest.raises(P.RevealTooLate):
        chain.block(("v1", rev))


def _play(chain, run, ch, values, *, bucket_of=None):
    """Verifiers v1.. commit to `values` in one block, reveal them in one block; resolve."""
    pairs = [witness(ch.challenge_id, f"v{i + 1}", v, bucket_of(i) if bucket_of else 0)
             for i, v in enumerate(values)]
    chain.block(*[(f"v{i + 1}", com) for i, (com, _) in enumerate(pairs)])
    chain.advance_to(ch.commit_deadline)
    chain.block(*[(f"v{i + 1}", rev) for i, (_, rev) in enumerate(pairs)])
    return chain.advance_to(ch.escalate_deadline + 1)


def test_honest_verdict_with_outlier():
    chain, run, ch = opened()
    good = run.value_hash(ch.step)
    events = _play(chain, run, ch, [good, good, digest("pot/noise", 1)])
    resolved, outlier, penalty, paid1, paid2, settled = events
    assert resolved.verdict == "honest" and resolved.cluster_size == 2 and resolved.reveals == 3
    assert resolved.winning_value == good and resolved.outliers == ("v3",)
    assert resolved.round == 1 and resolved.rechallenge is None
    assert isinstance(outlier, P.VerifierOutlier) and outlier.verifier == "v3"
    assert isinstance(penalty, P.VerifierPenalized) and (penalty.verifier, penalty.why) == ("v3", "outlier")
    assert penalty.amount == PARAMS.outlier_penalty
    # The winning cluster's seats are paid their fee from the run's escrow, the penalty is burned.
    fee = chain.state.runs[run.run_id].seat_fee
    assert fee == PARAMS.fee_per_replay_block * chain.state.runs[run.run_id].replay_blocks > 0
    assert [(e.verifier, e.amount, e.why) for e in (paid1, paid2)] == [
        ("v1", fee, "seat_fee"),
        ("v2", fee, "seat_fee"),
    ]
    assert chain.state.vbonds == {"v1": 100 + fee, "v2": 100 + fee, "v3": 100 - PARAMS.outlier_penalty}
    assert chain.state.burned == PARAMS.outlier_penalty and chain.state.reserved == {}
    assert chain.of(P.MinerSlashed) == []
    # The run's one challenge is resolved: its stake and the rest of its escrow are released.
    assert isinstance(settled, P.RunSettled) and settled.stake_released == PARAMS.miner_stake
    assert (
        settled.escrow_released == chain.state.runs[run.run_id].escrow - 2 * fee
        and settled.escrow_burned == 0
    )
    # A round below the dispute round resolves after its escalation window.
    assert ch.escalate_deadline == ch.reveal_deadline + PARAMS.escalation_window
    assert resolved.block == ch.escalate_deadline + 1


def test_fraud_verdict_slashes_miner():
    chain, run, ch = opened()
    truth = digest("pot/true-replay", 1)  # verifiers agree on a value the miner's leaf does not match
    events = _play(chain, run, ch, [truth, truth, truth])
    assert events[0].verdict == "fraud" and events[0].winning_value == truth
    assert isinstance(events[1], P.MinerSlashed) and events[1].amount == 400
    # slash_reward_share (1/2) of the slash goes to the winning seats, shared per seat; the rest,
    # and what the equal share leaves over, is burned.
    share = 400 * PARAMS.slash_reward_share.numerator // PARAMS.slash_reward_share.denominator
    burned = [(e.amount, e.why) for e in events if isinstance(e, P.Burned)]
    assert burned == [
        (400 - share, "the slash not paid to seats"),
        (share % 3, "slash_share: remainder of an equal share"),
    ]
    fee = chain.state.runs[run.run_id].seat_fee
    paid = [(e.verifier, e.amount, e.why) for e in events if isinstance(e, P.VerifierPaid)]
    assert paid == [
        *((v, fee, "seat_fee") for v in VERIFIERS),
        *((v, share // 3, "slash_share") for v in VERIFIERS),
    ]
    assert chain.state.vbonds == dict.fromkeys(VERIFIERS, 100 + fee + share // 3)
    assert chain.state.paid == dict.fromkeys(VERIFIERS, fee + share // 3)
    assert chain.state.burned == 400 - share + share % 3
    (settled,) = [e for e in events if isinstance(e, P.RunSettled)]
    assert settled.stake_released == PARAMS.miner_stake - 400


def test_inconclusive_without_quorum_no_slash_and_a_rechallenge():
    chain, run, ch = opened()
    events = _play(chain, run, ch, [run.value_hash(ch.step), digest("pot/n", 1)])
    resolved, penalty, reissued = events
    # Two reveals, quorum_min_reveals is 3: no verdict yet, the step is challenged again.
    assert resolved.verdict == "inconclusive" and resolved.rechallenge is not None
    assert chain.of(P.MinerSlashed) == []
    assert isinstance(penalty, P.VerifierPenalized) and (penalty.verifier, penalty.why) == ("v3", "no_commit")
    assert isinstance(reissued, P.ChallengeIssued)
    assert reissued.challenge_id == resolved.rechallenge != ch.challenge_id
    assert (reissued.round, reissued.first) == (2, ch.challenge_id)
    assert (reissued.run_id, reissued.step, reissued.index) == (ch.run_id, ch.step, ch.index)


def test_slash_never_exceeds_stake():
    params = P.ProtocolParams(challenges_per_run=3, slash_amount=400, miner_stake=1000, challenge_delay=1)
    chain, run = registered(params, units=10)  # units for three concurrent committees
    chain.block(("miner", run.submit_full_root()))
    chain.advance_to(chain.number + 1 + 2 + params.opening_deadline + 1)  # three issue blocks, no opening
    assert [s.amount for s in chain.of(P.MinerSlashed)] == [400, 400, 200]
    assert chain.of(P.VerifierPenalized) == []  # with no opening there was nothing to witness
    # No seat won a round with no opening: nobody is paid, and the slashes' reward shares are
    # burned with the rest of them.
    assert chain.of(P.VerifierPaid) == [] and chain.state.burned == 1000
    (settled,) = chain.of(P.RunSettled)
    assert (settled.stake_released, settled.escrow_burned) == (0, 0)
    assert settled.escrow_released == chain.state.runs[run.run_id].escrow


def test_bucket_mode_declaration():
    run = SyntheticRun(profile="torch-native")
    chain, run, ch = opened(run=run)
    assert ch.mode == "bucket"
    with pytest.raises(P.NotRunOwner):
        chain.block(("v1", DeclareWitnessNormBucket(ch.challenge_id, 5)))
    (ev,) = chain.block(("miner", DeclareWitnessNormBucket(ch.challenge_id, 5)))
    assert ev.bucket == 5
    assert chain.block(("miner", DeclareWitnessNormBucket(ch.challenge_id, 5))) == []
    with pytest.raises(P.AlreadyDeclared):
        chain.block(("miner", DeclareWitnessNormBucket(ch.challenge_id, 6)))
    # Different hardware, different value hashes, same bucket: honest.
    events = _play(
        chain, run, ch, [digest("pot/a", i) for i in range(3)], bucket_of=lambda i: 5 if i < 2 else 9
    )
    assert events[0].verdict == "honest" and events[0].winning_value == 5 and events[0].outliers == ("v3",)


def test_bucket_declaration_refusals():
    chain, run, ch = opened()
    with pytest.raises(P.NotCrossArchitecture):
        chain.block(("miner", DeclareWitnessNormBucket(ch.challenge_id, 5)))
    run = SyntheticRun(profile="torch-native")
    chain, run, ch = opened(run=run)
    chain.advance_to(ch.commit_deadline)
    with pytest.raises(P.DeclarationTooLate):
        chain.block(("miner", DeclareWitnessNormBucket(ch.challenge_id, 5)))


def test_closed_challenge_refuses_calls():
    chain, run, ch = challenged()
    chain.advance_to(ch.opening_deadline + 1)  # no opening: resolved as fraud before the commit window ends
    assert chain.of(P.ChallengeResolved)[0].verdict == "fraud"
    com, _ = witness(ch.challenge_id, "v1", run.value_hash(ch.step))
    with pytest.raises(P.ChallengeClosed, match="already resolved \\(fraud\\)"):
        chain.block(("v1", com))


# --- records, snapshots, params ----------------------------------------------------------------


def test_apply_recorded_never_raises():
    chain = PureChain(PARAMS)
    run = SyntheticRun()
    events = chain.block(("miner", run.submit_full_root()), strict=False)
    (ev,) = events
    assert (
        isinstance(ev, P.CallRefused) and ev.refusal == "UnknownRun" and ev.call == "submit_checkpoint_root"
    )
    assert ev.origin == "miner" and "no run" in ev.reason


def test_events_to_json_use_hex():
    chain, run, ch = opened()
    d = json.loads(ch.to_json())
    assert d["event"] == "ChallengeIssued" and d["run_id"] == run.run_id.hex() and d["step"] == ch.step
    assert d["committee"] == list(VERIFIERS) and d["round"] == 1 and d["first"] is None
    resolved = _play(chain, run, ch, [run.value_hash(ch.step)] * 3)[0]
    d = resolved.to_dict()
    assert d["winning_value"] == run.value_hash(ch.step).hex()
    # Exact profiles cluster the whole witness pair (value hash, proof hash).
    assert d["clusters"] == [[(run.value_hash(ch.step) + proof(ch.challenge_id)).hex(), 3]]
    assert d["round"] == 1 and d["rechallenge"] is None
    json.dumps(d)


def test_snapshot_round_trip_continues_identically():
    chain, run, ch = opened()
    com, _ = witness(ch.challenge_id, "v1", run.value_hash(ch.step))
    chain.block(("v1", com))
    snap = chain.state.to_cbor()
    restored = P.ProtocolState.from_cbor(snap)
    assert restored == chain.state
    twin = PureChain(PARAMS)
    twin.state, twin.number = restored, chain.number
    a = _play(chain, run, ch, [run.value_hash(ch.step)] * 3)
    twin_events = _play(twin, run, ch, [run.value_hash(ch.step)] * 3)
    assert a == twin_events and chain.state == twin.state


def test_bad_snapshot_refused():
    with pytest.raises(P.SnapshotError, match="unusable"):
        P.ProtocolState.from_cbor(b"\xa0")
    with pytest.raises(P.SnapshotError):
        P.ProtocolState.from_cbor(b"garbage")


def test_params_validated():
    with pytest.raises(ValueError, match="commit_window"):
        P.ProtocolParams(commit_window=0)
    with pytest.raises(ValueError, match="quorum_share"):
        P.ProtocolParams(quorum_share=Fraction(0))
    with pytest.raises(ValueError, match="forced_challenge_steps"):
        P.ProtocolParams(forced_challenge_steps=(0,))
    p = P.ProtocolParams(quorum_share="2/3", forced_challenge_steps=[7])
    assert p.quorum_share == Fraction(2, 3) and p.forced_challenge_steps == (7,)
    assert P.ProtocolParams.from_dict(p.to_dict()) == p


def test_blocks_must_advance():
    chain = PureChain(PARAMS)
    chain.block()
    from chain.transport import Block
    with pytest.raises(ValueError, match="not after"):
        P.on_block(chain.state, Block(1, b"\x00" * 32))


def test_params_from_operator_mapping():
    p = P.ProtocolParams.from_dict({"quorum_share": "2/3", "commit_window": 9})
    assert p.quorum_share == Fraction(2, 3) and p.commit_window == 9 and p.reveal_window == 4
    assert P.ProtocolParams.from_dict({"quorum_share": 0.5}).quorum_share == Fraction(1, 2)
    with pytest.raises(ValueError, match="unknown protocol parameter\\(s\\) comit_window"):
        P.ProtocolParams.from_dict({"comit_window": 3})
    with pytest.raises(ValueError, match="quorum_share must be a fraction"):
        P.ProtocolParams.from_dict({"quorum_share": "most"})
