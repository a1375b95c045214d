"""Random call sequences against the protocol (Hypothesis RuleBasedStateMachine), protocol v3.

Two states receive the same blocks; only the order of reveals inside a block differs between
them. Verifiers bond and unbond, committees are drawn per challenge from seat units of free bond,
seats reserve their collateral, reveals carry the witness pair, inconclusive or refused rounds
re-challenge the step, accounts escalate verdicts to the dispute round (one open at a time, the
others queued), and winning seats are paid.

Invariants: no reveal without a commit; one commit per verifier per challenge; only committee
members commit, and the run's miner never sits; verdicts do not depend on the order of reveals;
registering a run is idempotent; a refused call changes nothing (a commitment mismatch only adds
its recorded rejection); slashes never exceed stakes; rounds chain to their first round (an
escalated one straight to the dispute round); every penalty is for a member of the challenge's
committee; reservations are exactly what the seats of open rounds below the dispute round and
the escalation stakes hold (a dispute round's seats hold outside them), at most one dispute round
is open and an escalated round waits for its own; the registry holds exactly the accounts with
stake; no bond goes negative and every bonded unit is active, unbonding, released, penalised or
forfeited, and every paid one came from an escrow, a slash or a dispute's pool; no unit is made or
lost (what was bonded, staked and escrowed is held, released or burned), and what is burned is the
Burned events and the penalties of rounds below the dispute round at their own resolution; an
honest miner is never slashed in a round where every committee member revealed the honest pair.
"""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chain import protocol as P
from chain.calls import DeclareWitnessNormBucket, EscalateChallenge, StartTrainingCommitment, UnbondVerifier
from chain.protocol.params import MAX_COMMITTEE
from chain.transport import Block
from challenges.refused import REFUSED_BUCKET, refused_pair
from commitments.hashing import digest
from tests.chain.runs import SyntheticRun, bond, proof, witness

PARAMS = P.ProtocolParams(commit_window=3, reveal_window=3, opening_deadline=6, challenge_delay=1,
                          challenges_per_run=2, quorum_min_reveals=2, committee_size=3, max_rounds=3,
                          slash_amount=600, verifier_stake=100, no_show_penalty=30, outlier_penalty=40,
                          unbonding_delay=6, escalation_window=2, escalation_stake=50)
RUNS = [SyntheticRun(steps=4, seed="A"), SyntheticRun(steps=5, seed="B", profile="torch-native"),
        SyntheticRun(steps=6, seed="C")]
ACCOUNTS = ["miner", "v1", "v2", "v3", "v4"]
VERIFIERS = ACCOUNTS[1:]
# 14 seat units for the four first challenges' 12 seats (three a round: a winning pair and a
# dissenter who may escalate); v4's first bond is below verifier_stake, refused
# (BondBelowMinimum) until it bonds enough.
FIRST_BONDS = {"v1": 700, "v2": 400, "v3": 300, "v4": 60}
NOISE = [digest("pot/test/noise", i) for i in range(2)]
HONEST, REFUSE = 0, 3  # pick choices: 0 the honest pair, 1-2 noise, 3 the refused pair
TRUE_BUCKET = 0  # the bucket an honest replay of run B gives (and an honest miner declares)


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
        # Verifiers bond first; runs A and B are complete and challenged from the start, so the
        # steps go to the challenge life cycle; run C is registered and left to the root rules.
        self._queue([(v, bond(a)) for v, a in FIRST_BONDS.items()] + [("miner", r.register()) for r in RUNS])
        self._seal()
        for r in RUNS[:2]:
            self._queue([("miner", r.submit_full_root())])
        self._seal()
        self._seal()
        self._seal()
        assert len(self.main.challenges) == 4  # two runs, two challenges each, one per block

    # --- driving ---------------------------------------------------------------------------
    # Rules queue calls into the pending block; only `advance` seals blocks, so time passes
    # when the machine says so and windows are reached as often as they are missed.
    def _queue(self, calls, twin_calls=None):
        self.pending += calls
        self.twin_pending += twin_calls if twin_calls is not None else calls

    def _seal(self):
        self.number += 1
        blk = Block(self.number, digest("pot/test/block", self.number))
        evs = P.on_block(self.main, blk)
        self.events += evs
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

    def _witness(self, ch, v, choice, bucket):
        """(commit, reveal) of verifier v for a pick: the honest pair, noise, or the refused pair."""
        if choice == REFUSE:
            value, p = refused_pair(ch.challenge_id)
            return witness(ch.challenge_id, v, value, REFUSED_BUCKET, proof_hash=p)
        if choice == HONEST:
            return witness(ch.challenge_id, v, self._run(ch).value_hash(ch.step), bucket)
        return witness(ch.challenge_id, v, NOISE[choice - 1], bucket, proof_hash=NOISE[choice - 1])

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

    @rule(v=st.sampled_from(ACCOUNTS), amount=st.sampled_from([10, 50, 100, 200]))
    def bond_more(self, v, amount):
        self._queue([(v, bond(amount))])

    @rule(v=st.sampled_from(VERIFIERS), amount=st.sampled_from([10, 50, 100, 150, 10_000, "all", "free"]))
    def unbond(self, v, amount):
        # more than the active bond: AmountOverBond; than the free bond: BondReserved; a rest below
        # verifier_stake: BondBelowMinimum
        if amount == "all":
            amount = max(1, self.main.vbonds.get(v, 0))
        elif amount == "free":
            amount = max(1, P.free_bond(self.main, v))
        self._queue([(v, UnbondVerifier(amount))])

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), who=st.sampled_from(ACCOUNTS))
    def escalate(self, i, who):
        """Anyone's escalation of any challenge, the run's miner included (often refused:
        NotEscalable, InsufficientFreeBond)."""
        self._queue([(who, EscalateChallenge(self._challenge(i).challenge_id))])

    @rule()
    def dissenters_escalate(self):
        """Every seat that revealed another value than the round's winning one escalates it, for
        the rounds whose escalation window the next block falls in."""
        for ch in sorted(self.main.challenges.values(), key=lambda c: c.challenge_id):
            self._queue(self._dissent(ch, self.number + 1))

    def _dissent(self, ch, n):
        """The escalations of round `ch`'s dissenting seats, if block n is in its escalation window."""
        if ch.verdict is not None or ch.dispute or not ch.reveal_deadline < n <= ch.escalate_deadline:
            return []
        result = P.round_result(self.main, ch.challenge_id)
        if result.verdict not in ("honest", "fraud"):
            return []
        value = (lambda r: r[0]) if ch.mode == "value" else (lambda r: r[1])
        return [(v, EscalateChallenge(ch.challenge_id)) for v in sorted(ch.reveals)
                if value(ch.reveals[v]) != result.winning_value and v not in ch.escalations]

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), how=st.sampled_from(["honest", "honest", "honest", "wrong-leaf", "not-miner"]),
          bucket=st.sampled_from([TRUE_BUCKET, TRUE_BUCKET, 1]))
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
        """Several accounts commit in one block, mostly committee members and the honest pair."""
        ch = self._challenge(i)
        pool = list(ch.committee) * 3 + ACCOUNTS
        vs = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        picks = {v: (data.draw(st.sampled_from([HONEST, HONEST, HONEST, 1, 2, REFUSE])),
                     data.draw(st.sampled_from([TRUE_BUCKET, TRUE_BUCKET, 1])))
                 for v in vs}
        self._commit(ch, picks)

    def _commit(self, ch, picks):
        coms = {}
        for v, (c, b) in picks.items():
            com = self._witness(ch, v, c, b)[0]
            self.picks[com.commitment] = (c, REFUSED_BUCKET if c == REFUSE else b)
            coms[v] = com
        self._queue(list(coms.items()))

    @precondition(lambda self: self.main.challenges)
    @rule(i=st.integers(0, 7), data=st.data())
    def honest_round(self, i, data):
        """What honest parties do next for a challenge, given the block the calls will land in:
        the miner opens (and declares the true bucket), every committee member commits to the
        honest pair, then every one that committed reveals."""
        ch = self._challenge(i)
        n = self.number + 1
        if ch.opening is None and n <= ch.opening_deadline:
            self.respond(i, "honest", TRUE_BUCKET)
        elif n <= ch.commit_deadline and ch.verdict is None:
            self._commit(ch, {v: (HONEST, TRUE_BUCKET) for v in ch.committee if v not in ch.commitments})
        elif n <= ch.reveal_deadline and ch.verdict is None:
            self.reveal_batch(i, data)
        else:
            self.advance(1)

    @precondition(lambda self: any(ch.verdict is None for ch in self.main.challenges.values()))
    @rule(
        silent=st.sets(st.sampled_from(VERIFIERS), max_size=1),
        noisy=st.sets(st.sampled_from(VERIFIERS), max_size=1),
        refuse=st.booleans(),
        blocks=st.integers(1, 3),
        dissent=st.booleans(),
    )
    def everyone_next(self, silent, noisy, refuse, blocks, dissent):
        """Every open challenge moves on by one honest step per block (the miner opens, the
        committee commits, then reveals what it committed), except that `silent` verifiers stay
        away, `noisy` ones commit noise, with `refuse` the committee refuses the opening, and with
        `dissent` the seats outside a round's winning cluster escalate it."""
        for _ in range(blocks):
            n = self.number + 1
            for ch in sorted(self.main.challenges.values(), key=lambda c: c.challenge_id):
                if ch.verdict is not None:
                    continue
                if ch.opening is None and n <= ch.opening_deadline:
                    self._queue([("miner", self._run(ch).opening(ch.challenge_id, ch.step)),
                                 ("miner", DeclareWitnessNormBucket(ch.challenge_id, TRUE_BUCKET))])
                elif ch.opening is not None and n <= ch.commit_deadline:
                    pick = REFUSE if refuse else HONEST
                    self._commit(ch, {v: (1 if v in noisy else pick, TRUE_BUCKET) for v in ch.committee
                                      if v not in ch.commitments and v not in silent})
                elif ch.commit_deadline < n <= ch.reveal_deadline:
                    calls = [(v, self._witness(ch, v, *self.committed[(ch.challenge_id, v)])[1])
                             for v in sorted(ch.commitments) if v not in ch.reveals and v not in silent]
                    self._queue(calls, list(reversed(calls)))
                elif dissent:
                    self._queue(self._dissent(ch, n))
            self._seal()

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
            choice, bucket = self.committed.get((ch.challenge_id, v), (HONEST, TRUE_BUCKET))
            if data.draw(st.integers(0, 5)) == 0:
                choice, bucket = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 2))
            _, rev = self._witness(ch, v, choice, bucket)
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
        counts = Counter(
            (e.challenge_id, e.verifier) for e in self.events if isinstance(e, P.WitnessCommitted)
        )
        assert all(c == 1 for c in counts.values())

    @invariant()
    def only_the_committee_commits_and_the_miner_never_sits(self):
        for ch in self.main.challenges.values():
            assert set(ch.commitments) <= set(ch.committee)  # seats drawn with replacement may repeat
            assert self.main.runs[ch.run_id].miner not in ch.committee

    @invariant()
    def verdict_independent_of_reveal_order(self):
        def resolved(events):
            kinds = (
                P.ChallengeResolved
                | P.MinerSlashed
                | P.VerifierOutlier
                | P.VerifierPenalized
                | P.ChallengeIssued
                | P.VerifierPaid
                | P.Burned
                | P.EscalationSettled
                | P.RunSettled
            )
            return [e for e in events if isinstance(e, kinds)]

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
            assert run.drawn <= PARAMS.challenges_per_run
            assert 0 <= run.escrow_left <= run.escrow and (not run.settled or run.escrow_left == 0)
        for ch in self.main.challenges.values():
            assert 1 <= ch.step <= ch.size - 1
            assert ch.opening_deadline < ch.commit_deadline < ch.reveal_deadline

    @invariant()
    def rounds_chain_to_their_first(self):
        p = PARAMS
        for ch in self.main.challenges.values():
            assert 1 <= ch.round <= p.max_rounds + 1  # a refused dispute round reopens once more
            seats = (
                None if ch.round >= p.max_rounds else min(p.committee_size << (ch.round - 1), MAX_COMMITTEE)
            )
            # drawn without replacement: the round's seats, or every free unit when there are fewer
            assert ch.dispute == (seats is None)
            assert seats is None or len(ch.committee) <= seats
            if ch.round == 1:
                assert ch.first is None and ch.escalated is None
                assert 1 <= len(ch.committee) <= p.committee_size  # a first round waits for a free unit
                continue
            first = self.main.challenges[ch.first]
            assert first.round == 1 and (first.run_id, first.step, first.index) == (
                ch.run_id,
                ch.step,
                ch.index,
            )
            prev = [c for c in self.main.challenges.values() if c.rechallenge == ch.challenge_id]
            assert len(prev) == 1 and prev[0].verdict == "inconclusive"
            if ch.escalated is not None:  # an escalation goes straight to the dispute round
                assert ch.escalated == prev[0].challenge_id and ch.dispute and prev[0].round < ch.round
            else:
                assert prev[0].round == ch.round - 1
        for ch in self.main.challenges.values():
            if ch.rechallenge is not None:
                assert ch.verdict == "inconclusive" and ch.rechallenge in self.main.challenges

    @invariant()
    def penalties_only_for_committee_members(self):
        for e in self.events:
            if isinstance(e, P.VerifierPenalized):
                ch = self.main.challenges[e.challenge_id]
                assert e.verifier in ch.committee, (e.verifier, ch.committee)
                assert e.amount > 0 and e.why in ("no_commit", "no_reveal", "outlier")
            if isinstance(e, P.VerifierOutlier):
                assert e.verifier in self.main.challenges[e.challenge_id].committee

    @invariant()
    def bonds_never_negative_and_conserved(self):
        bonded, released, penalized, paid, forfeited = Counter(), Counter(), Counter(), Counter(), Counter()
        for e in self.events:
            if isinstance(e, P.VerifierBonded):
                bonded[e.verifier] += e.amount
            elif isinstance(e, P.BondReleased):
                released[e.verifier] += e.amount
            elif isinstance(e, P.VerifierPenalized):
                penalized[e.verifier] += e.amount
            elif isinstance(e, P.VerifierPaid):
                paid[e.verifier] += e.amount
            elif isinstance(e, P.EscalationSettled):
                forfeited[e.verifier] += e.forfeited
        for v in set(bonded) | set(self.main.vbonds) | set(self.main.unbonding):
            active = self.main.vbonds.get(v, 0)
            waiting = [x[1] for x in self.main.unbonding.get(v, [])]
            assert active >= 0 and all(w >= 0 for w in waiting)
            assert active + sum(waiting) == bonded[v] - released[v] - penalized[v] - forfeited[v] + paid[v], v
            miner_slashes = sum(r.slashed for r in self.main.runs.values() if r.miner == v)
            assert self.main.slashed.get(v, 0) == penalized[v] + forfeited[v] + miner_slashes
            assert self.main.paid.get(v, 0) == paid[v]

    @invariant()
    def reservations_are_what_open_seats_and_escalations_hold(self):
        s = self.main
        held, staked = Counter(), Counter()
        for ch in s.challenges.values():
            open_ = ch.verdict is None or ch.pending
            assert open_ or not any(ch.held.values()), "a settled round still holds collateral"
            for a, amount in ch.held.items():
                assert 0 <= amount <= ch.collateral * ch.committee.count(a)  # a seat holds verifier_stake
                if not ch.dispute:  # a dispute round's seats hold outside `reserved`
                    held[a] += amount
            for a, (disputed, stake) in ch.escalations.items():
                assert open_ and not ch.dispute and disputed in ("honest", "fraud") and stake > 0
                held[a] += stake
                staked[a] += stake
            if ch.pending:  # an escalated round waits for its dispute round: queued, or open
                children = [c for c in s.challenges.values() if c.escalated == ch.challenge_id]
                if ch.queued:
                    assert children == [] and ch.challenge_id in [d[0] for d in s.disputes]
                else:
                    assert len(children) == 1 and children[0].verdict is None and children[0].dispute
        assert s.reserved == {a: x for a, x in held.items() if x}
        assert s.staked == {a: x for a, x in staked.items() if x}
        assert all(
            x <= s.vbonds.get(a, 0) for a, x in s.staked.items()
        )  # every stake can be forfeited in full
        assert sum(1 for c in s.challenges.values() if c.dispute and c.verdict is None) <= 1
        for cid, _, _ in s.disputes:
            assert s.challenges[cid].queued and s.challenges[cid].rechallenge is None

    @invariant()
    def the_registry_holds_exactly_the_accounts_with_stake(self):
        s = self.main
        assert len(set(s.verifiers)) == len(s.verifiers)
        holding = {a for a in s.verifiers if s.vbonds.get(a, 0) or s.unbonding.get(a) or s.reserved.get(a)}
        assert set(s.verifiers) == holding
        assert set(s.vbonds) | set(s.unbonding) | set(s.reserved) <= set(s.verifiers)

    @invariant()
    def no_unit_is_made_or_lost(self):
        """What was bonded, staked and escrowed is held (active, unbonding, a run's unslashed stake,
        its escrow left), released (unbonded, or a settled run's escrow) or burned; and everything
        burned is a penalty or a Burned event."""
        s = self.main
        ins = sum(e.amount for e in self.events if isinstance(e, P.VerifierBonded))
        ins += sum(e.stake + e.escrow for e in self.events if isinstance(e, P.RunRegistered))
        held = sum(s.vbonds.values()) + sum(x[1] for w in s.unbonding.values() for x in w)
        held += sum(r.stake - r.slashed + r.escrow_left for r in s.runs.values())
        out = sum(e.amount for e in self.events if isinstance(e, P.BondReleased))
        out += sum(e.escrow_released for e in self.events if isinstance(e, P.RunSettled))
        assert ins == held + out + s.burned
        # A round below the dispute round burns the penalties of its own resolution; the dispute
        # round's, and those it charges the escalated round it settles, pay its winning seats.
        resolved_at = {e.challenge_id: e.block for e in self.events if isinstance(e, P.ChallengeResolved)}
        burns = sum(e.amount for e in self.events if isinstance(e, P.Burned))
        burns += sum(e.amount for e in self.events if isinstance(e, P.VerifierPenalized)
                     and not s.challenges[e.challenge_id].dispute and e.block == resolved_at[e.challenge_id])
        assert s.burned == burns

    @invariant()
    def an_honest_miner_with_an_honest_committee_is_never_slashed(self):
        # The miner's leaves are all right. A round whose opening is on chain and whose every
        # committee member revealed the honest pair (and, for a bucket run, whose declared bucket
        # is the true one) is never fraud.
        for e in self.events:
            if not (isinstance(e, P.ChallengeResolved) and e.verdict == "fraud"):
                continue
            ch = self.main.challenges[e.challenge_id]
            run = self._run(ch)
            all_honest = (ch.opening is not None and ch.opening["leaf"] == run.leaves[ch.step]
                          and all(_honest_reveal(ch, run, ch.reveals.get(v)) for v in ch.committee)
                          and (ch.mode == "value" or ch.declared_bucket == TRUE_BUCKET))
            assert not all_honest, f"round {ch.round} of step {ch.step} slashed an honest miner: {e.reason}"


def _honest_reveal(ch, run, r) -> bool:
    """An accepted reveal that an honest replay of the round gives."""
    if r is None:
        return False
    if ch.mode == "value":  # clustered by the pair
        return r[0] == run.value_hash(ch.step) and r[2] == proof(ch.challenge_id)
    return r[1] == TRUE_BUCKET  # clustered by the bucket


ProtocolMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocolMachine = ProtocolMachine.TestCase
