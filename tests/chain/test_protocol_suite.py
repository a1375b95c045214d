"""The protocol suite, run over every transport (`network` fixture: dev, chopsticks).

Calls go through a real transport; the state is derived by a ChainView from finalized blocks.
Origins are the chain's account ids (SS58 on Substrate), so run ids and witness commitments bind
those. The verifiers v1..v3 bond before the run's challenge is issued, so they are its committee.
"""

from __future__ import annotations

import dataclasses

from chain import protocol as P
from chain.calls import SubmitCheckpointRoot
from challenges.derive import challenge_step_at
from commitments.hashing import digest
from tests.chain.runs import SyntheticRun, bond, witness

VERIFIERS = ("v1", "v2", "v3")


class Flow:
    """One run on one network, with the view kept in step."""

    def __init__(self, network, seed: str = "suite") -> None:
        self.net = network
        self.run = SyntheticRun(seed=seed, miner=network.account("miner"))
        self.view = network.view()

    def submit(self, name: str, *calls) -> list[P.Event]:
        self.net.submit(name, *calls)
        return self.view.sync()

    def advance_to(self, number: int) -> list[P.Event]:
        head = self.net.transport("miner").finalized_head()
        if head < number:
            self.net.advance(number - head)
        return self.view.sync()

    def refusals(self, events) -> list[P.CallRefused]:
        return [e for e in events if isinstance(e, P.CallRefused)]

    def bond(self, *names: str) -> None:
        for name in names:
            (ev,) = [e for e in self.submit(name, bond(self.net.params.verifier_stake))
                     if isinstance(e, P.VerifierBonded)]
            assert ev.verifier == self.net.account(name) and ev.bond >= self.net.params.verifier_stake

    def issue(self) -> P.ChallengeIssued:
        """Bond the verifiers, register, grow the root in two steps, and wait for the challenge."""
        self.bond(*VERIFIERS)
        assert [type(e) for e in self.submit("miner", self.run.register())] == [P.RunRegistered]
        self.submit("miner", self.run.submit_root(4))
        events = self.submit("miner", self.run.submit_root(9, 4))
        (root_ev,) = [e for e in events if isinstance(e, P.CheckpointRootUpdated)]
        assert root_ev.complete
        self.root_block = root_ev.block
        self.advance_to(root_ev.challenges_at)
        (issued,) = self.view.of(P.ChallengeIssued)
        assert set(issued.committee) == {self.net.account(v) for v in VERIFIERS}
        return issued

    def open(self, ch) -> None:
        events = self.submit("miner", self.run.opening(ch.challenge_id, ch.step))
        assert [type(e) for e in events if not isinstance(e, P.ChallengeIssued)] == [P.OpeningSubmitted]

    def witnesses(self, ch, values: dict[str, bytes]) -> dict[str, tuple]:
        pairs = {name: witness(ch.challenge_id, self.net.account(name), v) for name, v in values.items()}
        for name, (com, _) in pairs.items():
            (ev,) = [e for e in self.submit(name, com) if isinstance(e, P.WitnessCommitted)]
            assert ev.verifier == self.net.account(name)
        self.advance_to(ch.commit_deadline)
        for name, (_, rev) in pairs.items():
            events = self.submit(name, rev)
            assert [type(e) for e in events] == [P.WitnessRevealed], events
        return pairs

    def resolve(self, ch) -> list[P.Event]:
        """The events of the block the round resolves at: after its escalation window."""
        self.advance_to(ch.escalate_deadline + 1)
        return [
            e
            for e in self.view.events
            if e.block == ch.escalate_deadline + 1 or isinstance(e, P.MinerSlashed)
        ]


def test_registration_is_idempotent_and_conflicts_refused(network):
    flow = Flow(network)
    run = flow.run
    assert [type(e) for e in flow.submit("miner", run.register())] == [P.RunRegistered]
    assert flow.submit("miner", run.register()) == []  # identical repeat: a no-op
    (refused,) = flow.refusals(flow.submit("miner", run.register(endpoint="http://other:1")))
    assert refused.refusal == "RunExists" and refused.origin == network.account("miner")
    (refused,) = flow.refusals(flow.submit("v1", run.register()))
    assert refused.refusal == "RunExists"
    # A registration of the miner's copied by v1 before the miner's lands: the run id is not v1's.
    pending = SyntheticRun(seed="suite-2", miner=network.account("miner")).register()
    (refused,) = flow.refusals(flow.submit("v1", pending))
    assert refused.refusal == "RunIdNotOwned"
    assert pending.run_id not in flow.view.state.runs
    assert len(flow.view.state.runs) == 1
    assert flow.view.state.runs[run.run_id].miner == network.account("miner")


def test_roots_append_only_with_consistency_proofs(network):
    flow = Flow(network)
    run = flow.run
    flow.submit("miner", run.register())
    (ev,) = flow.submit("miner", run.submit_root(3))
    assert ev.size == 3 and ev.root == run.root(3)
    bad = dataclasses.replace(run.submit_root(6, 3), consistency_proof=[digest("pot/x", 1)])
    (refused,) = flow.refusals(flow.submit("miner", bad))
    assert refused.refusal == "BadConsistencyProof"
    (refused,) = flow.refusals(flow.submit("miner", SubmitCheckpointRoot(run.run_id, run.root(2), 2, [])))
    assert refused.refusal == "RootNotAppendOnly"
    (refused,) = flow.refusals(flow.submit("v1", run.submit_root(6, 3)))
    assert refused.refusal == "NotRunOwner"
    (ev,) = flow.submit("miner", run.submit_root(6, 3))
    assert ev.size == 6 and not ev.complete
    assert flow.view.state.runs[run.run_id].root == run.root(6)


def test_honest_challenge_with_outlier(network):
    flow = Flow(network)
    ch = flow.issue()
    # The challenge derives from a block sealed after the root: its hash was unknown then.
    assert ch.block > flow.root_block
    issue_hash = network.transport("miner").block(ch.block).hash
    assert ch.step == challenge_step_at(issue_hash, flow.run.run_id, flow.run.root(9), 9, 0)
    flow.open(ch)
    good = flow.run.value_hash(ch.step)
    flow.witnesses(ch, {"v1": good, "v2": good, "v3": digest("pot/noise", 3)})
    events = flow.resolve(ch)
    resolved, outlier, penalty = [e for e in events if isinstance(e, (P.ChallengeResolved, P.VerifierOutlier,
                                                                      P.VerifierPenalized))]
    assert isinstance(resolved, P.ChallengeResolved)
    assert resolved.verdict == "honest" and resolved.cluster_size == 2 and resolved.reveals == 3
    assert resolved.winning_value == good
    assert resolved.outliers == (network.account("v3"),)
    assert isinstance(outlier, P.VerifierOutlier) and outlier.verifier == network.account("v3")
    assert isinstance(penalty, P.VerifierPenalized) and penalty.verifier == network.account("v3")
    assert penalty.why == "outlier"
    assert flow.view.of(P.MinerSlashed) == []
    # The winning seats are paid their fee from the run's escrow; the run settles, its stake released.
    fee = flow.view.state.runs[flow.run.run_id].seat_fee
    paid = {e.verifier: e.amount for e in events if isinstance(e, P.VerifierPaid)}
    assert paid == {network.account("v1"): fee, network.account("v2"): fee} and fee > 0
    (settled,) = [e for e in events if isinstance(e, P.RunSettled)]
    assert settled.stake_released == network.params.miner_stake and settled.escrow_burned == 0
    stake = network.params.verifier_stake
    assert flow.view.state.bonds[network.account("v1")] == stake
    assert flow.view.state.vbonds[network.account("v1")] == stake + fee
    assert flow.view.state.vbonds[network.account("v3")] == stake - penalty.amount
    assert flow.view.state.reserved == {}


def test_fraud_slashes_the_miner(network):
    flow = Flow(network)
    ch = flow.issue()
    flow.open(ch)
    replayed = digest("pot/honest-replay", ch.step)  # what the verifiers compute differs from leaf t
    flow.witnesses(ch, {"v1": replayed, "v2": replayed, "v3": replayed})
    events = flow.resolve(ch)
    (resolved,) = [e for e in events if isinstance(e, P.ChallengeResolved)]
    assert resolved.verdict == "fraud" and resolved.winning_value == replayed
    (slash,) = flow.view.of(P.MinerSlashed)
    assert slash.miner == network.account("miner") and slash.amount == network.params.slash_amount


def test_missing_opening_is_fraud(network):
    flow = Flow(network)
    ch = flow.issue()
    flow.advance_to(ch.opening_deadline + 1)
    (resolved,) = flow.view.of(P.ChallengeResolved)
    assert resolved.verdict == "fraud" and "no opening" in resolved.reason
    assert resolved.block == ch.opening_deadline + 1
    (slash,) = flow.view.of(P.MinerSlashed)
    assert slash.challenge_id == ch.challenge_id
    # Too late now: the opening is refused, and recorded as refused.
    (refused,) = flow.refusals(flow.submit("miner", flow.run.opening(ch.challenge_id, ch.step)))
    assert refused.refusal == "OpeningTooLate"


def test_reveal_mismatch_rejected_and_recorded(network):
    flow = Flow(network)
    ch = flow.issue()
    flow.open(ch)
    value = flow.run.value_hash(ch.step)
    com, rev = witness(ch.challenge_id, network.account("v1"), value)
    (outsider,) = flow.refusals(flow.submit("v4", witness(ch.challenge_id, network.account("v4"), value)[0]))
    assert outsider.refusal == "NotInCommittee"  # v4 never bonded
    flow.submit("v1", com)
    (early,) = flow.refusals(flow.submit("v1", rev))
    assert early.refusal == "RevealTooEarly"
    flow.advance_to(ch.commit_deadline)
    forged = dataclasses.replace(rev, value_hash=digest("pot/other", 1))
    events = flow.submit("v1", forged)
    assert [type(e) for e in events] == [P.RevealRejected, P.CallRefused]
    assert events[0].verifier == network.account("v1") and events[1].refusal == "CommitmentMismatch"
    assert flow.view.state.challenges[ch.challenge_id].reveals == {}
    (ev,) = flow.submit("v1", rev)  # the true opening of the commitment is still accepted
    assert isinstance(ev, P.WitnessRevealed)
