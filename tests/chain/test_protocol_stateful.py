"""Random call sequences against the protocol (Hypothesis RuleBasedStateMachine).

Two states receive the same blocks; only the order of reveals inside a block differs between
them. Invariants: no reveal without a commit; one commit per verifier per challenge; verdicts do
not depend on the order of reveals; registering a run is idempotent; a refused call changes
nothing (a commitment mismatch only adds its recorded rejection); slashes never exceed stakes.
"""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chain import protocol as P
from chain.calls import DeclareWitnessNormBucket, StartTrainingCommitment
from chain.transport import Block
from commitments.hashing import digest
from tests.chain.runs import SyntheticRun, witness

PARAMS = P.ProtocolParams(commit_window=2, reveal_window=3, opening_deadline=3, challenge_delay=1,
                          challenges_per_run=1, quorum_min_reveals=2, slash_amount=600)
RUNS = [SyntheticRun(steps=4, seed="A"), SyntheticRun(steps=5, seed="B", profile="torch-native"),
        SyntheticRun(steps=6, seed="C")]
ACCOUNTS = ["miner", "v1", "v2", "v3", "v4"]
VERIFIERS = ACCOUNTS[1:]
NOISE = [digest("pot/test/noise", i) for i in range(2)]


class ProtocolMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.main = P.new_state(PARAMS)
        self.twin = P.new_state(PARAMS)
        self.number = 0
        self.events: list[P.Event] = []
        self.twin_events: list[P.Event] = []
        self.first_registration: dict[bytes, tuple[str, bytes]] = {}
        self.committed: dict[tuple[bytes, str], tuple[int, int]] = {}  # what each accepted commit holds
        self.picks: dict[bytes, tuple[int, int]] = {}  # commitment -> what it holds
        self.pending: list = []
        self.twin_pending: list = []
        # Runs A and B are complete and challenged from the start, so the steps go to the
        # challenge life cycle; run C is registered and left to the root rules.
        for r in RUNS:
            self._queue([("miner", r.register())])
        self._seal()
        for r in RUNS[:2]:
            self._queue([("miner", r.submit_full_root())])
        self._seal()
        self._seal()
        assert len(self.main.challenges) == 2

    # --- driving ---------------------------------------------------------------------------
    # Rules queue calls into the pending block; only `advance` seals blocks, so time passes
    # when the machine says so and windows are reached as often as they are missed.
    def _queue(self, calls, twin_calls=None):
        self.pending += calls
        self.twin_pending += twin_calls if twin_calls is not None else calls

    def _seal(self):
        self.number += 1
        blk = Block(self.number, digest("pot/test/block", self.number))
        self.events += P.on_block(self.main, blk)
        self.twin_events += P.on_block(self.twin, blk)
        for origin, call in self.pending:
            evs = self._apply(self.main, call, origin, blk)
            self.events += evs
            for e in evs:
                if isinstance(e, P.WitnessCommitted):
                    self.committed[(e.challenge_id, e.verifier)] = self.picks[e.commitment]
        for origin, call in self.twin_pending:
            self.twin_events += P.apply_recorded(self.twin, call, origin, blk)
        self.pending, self.twin_pending = [], []

    def _apply(self, state, call, origin, blk):
        before = copy.deepcopy(state)
        events = P.apply_recorded(state, call, origin, blk)
        refused = [e for e in events if isinstance(e, P.CallRefused)]
        if refused and refused[0].refusal != "CommitmentMismatch":
            assert state == before, f"refused {refused[0].refusal} changed the state"
        elif refused:
            ch = state.challenges[call.challenge_id]
            ch_before = before.challenges[call.challenge_id]
            # One record per verifier (it keeps the list bounded): a second mismatch adds nothing.
            if any(r[1] == origin for r in ch_before.rejected):
                assert ch.rejected == ch_before.rejected
            else:
                assert ch.rejected[:-1] == ch_before.rejected and ch.rejected[-1][1] == origin
            assert (ch.reveals, ch.commitments) == (ch_before.reveals, ch_before.commitments)
        if isinstance(call, StartTrainingCommitment) and not refused:
            run = state.runs[call.run_id]
            self.first_registration.setdefault(call.run_id, (run.miner, run.registration))
        return events

    def _challenge(self, i):
        # Mostly the challenges still open (where calls do something), sometimes any.
        open_ids = sorted(c for c, ch in self.main.challenges.items() if ch.verdict is None)
        ids = open_ids if open_ids and i % 4 else sorted(self.main.challenges)
        return self.main.challenges[ids[i % len(ids)]]

    def _run(self, ch):
        return next(r for r in RUNS if r.run_id == ch.run_id)

    # --- rules -----------------------------------------------------------------------------
    @rule(r=st.sampled_from(RUNS), origin=st.sampled_from(["miner", "miner", "v1"]), same=st.booleans())
    def register(self, r, origin, same):
        call = r.register() if same else r.register(endpoint="http://elsewhere")
        self._queue([(origin, call)])

    @rule(r=st.sampled_from(RUNS), data=st.data())
    def submit_root(self, r, data):
        current = self.main.runs[r.run_id].size if r.run_id in self.main.runs else 0
        size = data.draw(st.integers(1, r.steps + 1))
        call = r.submit_root(size, current if 0 < current <= size else 0)
        # A forged root is refused once the run has one (its proof cannot hold); a forged first
        # root would be accepted and strand the run, which the honest-miner rules cannot undo.
        if current and not data.draw(st.booleans()):
            call = type(call)(call.run_id, digest("pot/test/forged", size), size, call.consistency_proof)
        self._queue([(data.draw(st.sampled_from(["miner", "miner", "v2"])), call)])

    @rule(r=st.sampled_from(RUNS))
    def complete_root(self, r):
        """The honest miner's next move: the full root, proven consistent with the current one."""
        current = self.main.runs[r.run_id].size
        self._queue([("miner", r.submit_root(r.steps + 1, current))])

    @rule(n=st.integers(1, 4))
    def advance(self, n):
        for _ in range(n):
            self._seal()

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), how=st.sampled_from(["honest", "honest", "honest", "wrong-leaf", "not-miner"]),
          bucket=st.integers(0, 2))
    def respond(self, i, how, bucket):
        """The miner's answer: the opening, and a reference bucket (refused for exact specs)."""
        ch = self._challenge(i)
        r = self._run(ch)
        other = 1 + (ch.step % r.steps)  # another step of the same run: wrong position
        opening = r.opening(ch.challenge_id, ch.step, leaf=r.leaves[other] if how == "wrong-leaf" else None)
        origin = "v1" if how == "not-miner" else "miner"
        self._queue([(origin, opening), (origin, DeclareWitnessNormBucket(ch.challenge_id, bucket))])

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), data=st.data())
    def commit_batch(self, i, data):
        """Several accounts commit in one block, mostly to the true value."""
        ch = self._challenge(i)
        vs = data.draw(st.lists(st.sampled_from(ACCOUNTS), min_size=1, max_size=4, unique=True))
        picks = {v: (data.draw(st.sampled_from([0, 0, 0, 1, 2])), data.draw(st.sampled_from([0, 0, 1])))
                 for v in vs}
        coms = {v: witness(ch.challenge_id, v, self._value(ch, c), b)[0] for v, (c, b) in picks.items()}
        for v, com in coms.items():
            self.picks[com.commitment] = picks[v]
        self._queue(list(coms.items()))

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), data=st.data())
    def honest_round(self, i, data):
        """What honest parties do next for a challenge, given the block the calls will land in."""
        ch = self._challenge(i)
        n = self.number + 1
        if ch.opening is None and n <= ch.opening_deadline:
            self.respond(i, "honest", 0)
        elif n <= ch.commit_deadline:
            self.commit_batch(i, data)
        elif n <= ch.reveal_deadline:
            self.reveal_batch(i, data)
        else:
            self.advance(1)

    def _value(self, ch, choice):
        return self._run(ch).value_hash(ch.step) if choice == 0 else NOISE[choice - 1]

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), data=st.data())
    def reveal_batch(self, i, data):
        """Several reveals in one block; the twin state gets them in another order."""
        ch = self._challenge(i)
        committed = [v for v in VERIFIERS if (ch.challenge_id, v) in self.committed]
        vs = data.draw(st.lists(st.sampled_from(committed or VERIFIERS), min_size=1, max_size=4, unique=True))
        calls = []
        for v in vs:
            # Mostly the committed value (an honest reveal); sometimes anything (a mismatch).
            choice, bucket = self.committed.get((ch.challenge_id, v), (0, 0))
            if data.draw(st.integers(0, 5)) == 0:
                choice, bucket = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
            _, rev = witness(ch.challenge_id, v, self._value(ch, choice), bucket)
            calls.append((v, rev))
        order = data.draw(st.permutations(range(len(calls))))
        self._queue(calls, [calls[j] for j in order])

    # --- invariants --------------------------------------------------------------------------
    @invariant()
    def no_reveal_without_commit(self):
        for ch in self.main.challenges.values():
            assert set(ch.reveals) <= set(ch.commitments)
        revealed = {(e.challenge_id, e.verifier) for e in self.events if isinstance(e, P.WitnessRevealed)}
        committed = {(e.challenge_id, e.verifier) for e in self.events if isinstance(e, P.WitnessCommitted)}
        assert revealed <= committed

    @invariant()
    def one_commit_per_verifier(self):
        counts = Counter((e.challenge_id, e.verifier) for e in self.events if isinstance(e, P.WitnessCommitted))
        assert all(c == 1 for c in counts.values())

    @invariant()
    def verdict_independent_of_reveal_order(self):
        def resolved(events):
            return [e for e in events if isinstance(e, P.ChallengeResolved | P.MinerSlashed | P.VerifierOutlier)]

        def canonical(state):
            # Rejections are logged in call order, which is exactly what the twin permutes.
            state = copy.deepcopy(state)
            for ch in state.challenges.values():
                ch.rejected.sort()
            return state

        assert resolved(self.events) == resolved(self.twin_events)
        assert canonical(self.main) == canonical(self.twin)

    @invariant()
    def registration_idempotent(self):
        counts = Counter(e.run_id for e in self.events if isinstance(e, P.RunRegistered))
        assert all(c == 1 for c in counts.values())
        for run_id, (miner, reg) in self.first_registration.items():
            assert (self.main.runs[run_id].miner, self.main.runs[run_id].registration) == (miner, reg)

    @invariant()
    def stakes_and_steps_sane(self):
        for run in self.main.runs.values():
            assert 0 <= run.slashed <= run.stake
        for ch in self.main.challenges.values():
            assert 1 <= ch.step <= ch.size - 1
            assert ch.opening_deadline < ch.commit_deadline < ch.reveal_deadline


ProtocolMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocolMachine = ProtocolMachine.TestCase
