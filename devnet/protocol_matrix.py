"""The protocol's adversary matrix: every strategy an actor of the network might play for gain,
each run through the real protocol state machine (`chain.protocol`), with the outcome the protocol
must give and exactly who pays. `pot redteam --protocol` prints it; tests/chain/test_adversary_matrix.py
asserts every row.

A row builds its own small network in memory: bonded verifiers, a miner and a synthetic run whose
leaves are real step leaves over made-up state digests (what the protocol checks — Merkle proofs,
leaf format, H(leaf t), the witness pair — is exactly what it checks for a real run; the replay
itself is the node's business and has its own tests). Honest verifiers reveal the pair a replay
gives: H(true leaf t) and the true post-state's proof, modelled as one secret per challenge that
only replayers know. Block hashes are chosen by the row, so that grinding (and a committee drawn
by bad luck) can be played too. As an honest node does, an honest seat that revealed what it
replayed escalates a round decided on another value (`dissent`), while it has escalation_stake free.

The invariants every row checks: fraud is caught or re-challenged, an honest miner is never
slashed, lazy or Sybil accounts lose bond, and the books hold (`books`: no bond below zero, every
reservation backs a seat or an escalation of an open round, every penalty is the rule's amount a
seat, paid in full from the seat's collateral).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from chain import protocol as P
from chain.calls import (
    BondVerifier,
    CommitWitness,
    EscalateChallenge,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    UnbondVerifier,
    derive_run_id,
)
from chain.protocol.params import MAX_DISPUTE_SEATS, MAX_VERIFIERS
from chain.protocol.state import escalation_room
from chain.transport import Block
from challenges.derive import challenge_id as derive_challenge_id
from challenges.derive import challenge_step_at, dispute_seats, draw_committee, seat_units
from challenges.refused import REFUSED_BUCKET, refused_pair
from challenges.witness import witness_commitment
from commitments import merkle
from commitments.hashing import digest
from commitments.leaves import step_leaf, witness_value_hash
from commitments.spec import Spec

MINER = "miner"


def _params(**kw: Any) -> P.ProtocolParams:
    base = dict(challenges_per_run=1, challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2,
                committee_size=5, quorum_min_reveals=2, max_rounds=3)
    base.update(kw)
    return P.ProtocolParams(**base)


@dataclass
class Net:
    """A network in memory: the protocol state, blocks with chosen hashes, and a synthetic run."""

    params: P.ProtocolParams
    steps: int = 16
    faked: frozenset[int] = frozenset()  # steps whose committed leaf is not what training gives
    state: P.ProtocolState = field(init=False)
    number: int = field(default=0, init=False)
    events: list[P.Event] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.state = P.new_state(self.params)
        self.nonce = digest("pot/matrix/nonce/v1")[:16]
        self.run_id = derive_run_id(MINER, self.nonce)
        self.true = [self._leaf(t, honest=True) for t in range(self.steps + 1)]
        self.leaves = [self._leaf(t, honest=t not in self.faked) for t in range(self.steps + 1)]

    def _leaf(self, t: int, *, honest: bool) -> bytes:
        kind = "true" if honest else "forged"
        return step_leaf(
            t, digest("pot/matrix/state/v1", kind if t else "true", t), 0x40000000 + t if t else 0
        )

    # --- blocks --------------------------------------------------------------------------------
    def block(self, *calls: tuple[str, Any], block_hash: bytes | None = None) -> list[P.Event]:
        self.number += 1
        h = block_hash if block_hash is not None else digest("pot/matrix/block/v1", self.number)
        blk = Block(self.number, h, tuple(calls))
        out = P.on_block(self.state, blk)
        for origin, call in calls:
            out += P.apply_recorded(self.state, call, origin, blk)
        self.events += out
        return out

    def until(self, number: int) -> None:
        while self.number < number:
            self.block()

    # --- the miner -----------------------------------------------------------------------------
    def spec(self, **model: Any) -> Spec:
        kw: dict[str, Any] = {"steps": self.steps}
        if model:
            kw["model"] = model
        return Spec.from_dict(kw)

    def registration(self, spec: Spec | None = None) -> StartTrainingCommitment:
        return StartTrainingCommitment(
            run_id=self.run_id,
            nonce=self.nonce,
            initial_hash=digest("pot/matrix/init/v1"),
            schedule_commitment=digest("pot/matrix/schedule/v1"),
            dataset_hash=digest("pot/matrix/dataset/v1"),
            spec=(spec or self.spec()).to_cbor(),
            declared_steps=self.steps,
            endpoint="http://miner.matrix:8000",
        )

    def full_root(self) -> SubmitCheckpointRoot:
        return SubmitCheckpointRoot(self.run_id, merkle.root(self.leaves), len(self.leaves), ())

    def opening(self, ch: P.ChallengeIssued) -> SubmitOpening:
        return SubmitOpening(ch.challenge_id, digest("pot/matrix/opening/v1", ch.step), f"http://miner.matrix/{ch.step}",
                             self.leaves[ch.step], tuple(merkle.inclusion_proof(self.leaves, ch.step)))

    # --- verifiers -----------------------------------------------------------------------------
    def honest_pair(self, ch: P.ChallengeIssued) -> tuple[bytes, bytes]:
        """What a replay gives: H(true leaf t) and the true post-state's proof for this challenge."""
        return witness_value_hash(self.true[ch.step]), digest("pot/matrix/proof/v1", ch.challenge_id, ch.step)

    def lazy_pair(self, ch: P.ChallengeIssued, who: str) -> tuple[bytes, bytes]:
        """All a verifier that does no work can reveal: the committed leaf's hash (public in
        OpeningSubmitted) and a proof it has to make up."""
        return witness_value_hash(self.leaves[ch.step]), digest("pot/matrix/guess/v1", who, ch.challenge_id)

    @staticmethod
    def commit(ch: P.ChallengeIssued, who: str, pair: tuple[bytes, bytes], bucket: int = 0
               ) -> tuple[tuple[str, CommitWitness], tuple[str, RevealWitnessValue]]:
        salt = digest("pot/matrix/salt/v1", who, ch.challenge_id)
        value, proof = pair
        com = witness_commitment(ch.challenge_id, value, bucket, salt, who, proof_hash=proof)
        return (who, CommitWitness(ch.challenge_id, com)), (
            who,
            RevealWitnessValue(ch.challenge_id, value, proof, bucket, salt),
        )

    def issued(self) -> list[P.ChallengeIssued]:
        return [e for e in self.events if isinstance(e, P.ChallengeIssued)]

    def resolved(self, cid: bytes) -> P.ChallengeResolved:
        return next(e for e in self.events if isinstance(e, P.ChallengeResolved) and e.challenge_id == cid)

    def penalties(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events:
            if isinstance(e, P.VerifierPenalized):
                out[e.verifier] = out.get(e.verifier, 0) + e.amount
        return out

    def slashed(self) -> int:
        return sum(e.amount for e in self.events if isinstance(e, P.MinerSlashed))

    def paid(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events:
            if isinstance(e, P.VerifierPaid):
                out[e.verifier] = out.get(e.verifier, 0) + e.amount
        return out

    def refusals(self, code: str) -> list[P.CallRefused]:
        return [e for e in self.events if isinstance(e, P.CallRefused) and e.refusal == code]


# A verifier's behaviour for one round: a pair to reveal, "refuse", "absent" (no commit), or
# "silent" (commits, never reveals).
Behaviour = Callable[[Net, P.ChallengeIssued, str], Any]
# Whether a seat escalates a decided round it dissents from (given the round and the seat).
Escalation = Callable[[Net, P.ChallengeIssued, str], bool]


def dissent(net: Net, ch: P.ChallengeIssued, who: str) -> bool:
    """What an honest seat does after the reveal window: it escalates when it revealed what its
    replay gave, the round is decided on another value half, and it has escalation_stake free."""
    mine = net.state.challenges[ch.challenge_id].reveals.get(who)
    if mine is None or mine[0] != net.honest_pair(ch)[0]:
        return False
    result = P.round_result(net.state, ch.challenge_id)
    return (result.verdict in ("honest", "fraud") and result.winning_value != mine[0]
            and escalation_room(net.state, who) >= net.state.params.escalation_stake)


def never(net: Net, ch: P.ChallengeIssued, who: str) -> bool:
    return False


def _acts(net: Net, ch: P.ChallengeIssued, behave: Behaviour
          ) -> tuple[list[tuple[str, CommitWitness]], list[tuple[str, RevealWitnessValue]]]:
    """The commitments and reveals of a round's seated accounts (an account holding several seats
    commits and reveals once)."""
    commits, reveals = [], []
    for who in dict.fromkeys(ch.committee):
        act = behave(net, ch, who)
        if act == "absent":
            continue
        pair = refused_pair(ch.challenge_id) if act == "refuse" else (
            net.honest_pair(ch) if act == "silent" else act)
        c, r = net.commit(ch, who, pair, REFUSED_BUCKET if act == "refuse" else 0)
        commits.append(c)
        if act != "silent":
            reveals.append(r)
    return commits, reveals


def _escalations(
    net: Net, ch: P.ChallengeIssued, escalate: Escalation
) -> list[tuple[str, EscalateChallenge]]:
    if ch.escalate_deadline <= ch.reveal_deadline:  # the dispute round: nothing to escalate to
        return []
    return [(who, EscalateChallenge(ch.challenge_id)) for who in dict.fromkeys(ch.committee)
            if escalate(net, ch, who)]


def play_round(net: Net, ch: P.ChallengeIssued, behave: Behaviour, *, open_it: bool = True,
               escalate: Escalation = dissent) -> P.ChallengeResolved:
    """One round of one challenge: the miner opens it (or not), each seated account does what
    `behave` says once the opening is on chain, a dissenting seat may escalate after the reveal
    window (`escalate`), and the blocks run until the round resolves (escalate_deadline + 1)."""
    if open_it:
        net.block((MINER, net.opening(ch)))
    commits, reveals = _acts(net, ch, behave)
    net.block(*commits)
    net.until(ch.commit_deadline)
    net.block(*reveals)
    net.until(ch.reveal_deadline)
    escalations = _escalations(net, ch, escalate)
    if escalations:
        net.block(*escalations)
    net.until(ch.escalate_deadline + 1)
    return net.resolved(ch.challenge_id)


def play_challenge(net: Net, first: P.ChallengeIssued, behave_by_round: Callable[[int], Behaviour], *,
                   open_by_round: Callable[[int], bool] = lambda r: True,
                   escalate: Escalation = dissent) -> list[P.ChallengeResolved]:
    """Every round of a challenge until one ends it (no re-challenge, no escalation)."""
    rounds, ch = [], first
    while True:
        res = play_round(
            net, ch, behave_by_round(ch.round), open_it=open_by_round(ch.round), escalate=escalate
        )
        rounds.append(res)
        if res.rechallenge is None:
            return rounds
        ch = next(e for e in net.issued() if e.challenge_id == res.rechallenge)


def play_run(net: Net, behave_by_round: Callable[[int], Behaviour], *, escalate: Escalation = dissent,
             limit: int = 2000, watch: Callable[[Net], None] | None = None) -> list[P.ChallengeResolved]:
    """Every round of every challenge of the run, played side by side block by block until the run
    is settled: the miner opens each round in the block after its issue, its seats commit in the
    block after the opening, reveal in the block after the commit deadline and may escalate in the
    block after the reveal deadline. `watch` sees the network after every block. Returns the
    resolutions in the order they came."""
    stage: dict[bytes, int] = {}
    planned: dict[bytes, list[tuple[str, RevealWitnessValue]]] = {}
    seen = len(net.events)
    while not net.state.runs[net.run_id].settled:
        if net.number >= limit:
            raise RuntimeError(f"the run is not settled by block {limit}")
        m, calls = net.number + 1, []
        for ch in net.issued():
            cid, st = ch.challenge_id, net.state.challenges[ch.challenge_id]
            s = stage.get(cid, 0)
            if st.verdict is not None:
                continue
            if s == 0 and m <= ch.opening_deadline:
                calls.append((MINER, net.opening(ch)))
                stage[cid] = 1
            elif s == 1 and st.opening is not None and m <= ch.commit_deadline:
                commits, planned[cid] = _acts(net, ch, behave_by_round(ch.round))
                calls += commits
                stage[cid] = 2
            elif s == 2 and m > ch.commit_deadline:
                calls += planned.pop(cid)
                stage[cid] = 3
            elif s == 3 and m > ch.reveal_deadline:
                calls += _escalations(net, ch, escalate)
                stage[cid] = 4
        net.block(*calls)
        if watch is not None:
            watch(net)
    return [e for e in net.events[seen:] if isinstance(e, P.ChallengeResolved)]


def setup(net: Net, bonds: dict[str, int], *, block_hash: bytes | None = None) -> P.ChallengeIssued:
    """Bond the verifiers, register the run with its complete root, and run the blocks until its
    first challenge is issued (from `block_hash`, if given)."""
    net.block(*[(v, BondVerifier(amount=b)) for v, b in bonds.items()])
    net.block((MINER, net.registration()), (MINER, net.full_root()))
    net.until(net.number + net.params.challenge_delay - 1)
    net.block(block_hash=block_hash)
    issued = net.issued()
    assert issued, "no challenge was issued"
    return issued[0]


def books(net: Net) -> list[str]:
    """What must hold of the accounts once the rows' play is over: no bond below zero, every
    reservation backs a seat or an escalation of an open round, every penalty was paid in full (a
    seat's penalty is at most verifier_stake, which it reserved), and a settled run holds nothing."""
    s, p = net.state, net.state.params
    out = [f"{a} has a bond of {b}" for a, b in s.vbonds.items() if b < 0]
    held: dict[str, int] = {}
    staked: dict[str, int] = {}
    for ch in s.challenges.values():
        for a, h in ch.held.items():
            if not ch.dispute:  # a dispute round's seats hold outside `reserved`
                held[a] = held.get(a, 0) + h
        for a, e in ch.escalations.items():
            held[a] = held.get(a, 0) + e[1]
            staked[a] = staked.get(a, 0) + e[1]
    if {a: h for a, h in held.items() if h} != s.reserved:
        out.append(f"reservations {s.reserved} differ from what open rounds hold {held}")
    if {a: h for a, h in staked.items() if h} != {a: h for a, h in s.staked.items() if h}:
        out.append(f"escalation stakes {s.staked} differ from the open escalations' {staked}")
    out += [f"{a} reserves {r} of a bond of {s.vbonds.get(a, 0)}" for a, r in s.reserved.items()
            if r > s.vbonds.get(a, 0)]
    for e in net.events:
        if isinstance(e, P.VerifierPenalized):
            seats = s.challenges[e.challenge_id].committee.count(e.verifier)
            rule = (p.outlier_penalty if e.why == "outlier" else p.no_show_penalty) * seats
            if e.amount != rule:
                out.append(
                    f"{e.verifier} paid {e.amount} for {e.why} on {seats} seat(s); the rule says {rule}"
                )
    if all(r.settled for r in s.runs.values()) and s.reserved:
        out.append(f"every run is settled, yet {s.reserved} stays reserved")
    return out


# --- the rows --------------------------------------------------------------------------------------

HONEST = lambda net, ch, who: net.honest_pair(ch)  # noqa: E731


@dataclass
class Row:
    name: str
    strategy: str
    expect: str  # the outcome the protocol must give, in words
    verdict: str = ""
    rounds: int = 0
    miner_slashed: int = 0
    penalized: dict[str, int] = field(default_factory=dict)
    expected_payers: tuple[str, ...] = ()
    paid: dict[str, int] = field(default_factory=dict)  # fees and shares credited to verifiers
    burned: int = 0
    detail: str = ""
    ok: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"row": self.name, "strategy": self.strategy, "expect": self.expect, "verdict": self.verdict,
                "rounds": self.rounds, "miner_slashed": self.miner_slashed, "penalized": self.penalized,
                "expected_payers": list(self.expected_payers), "paid": self.paid, "burned": self.burned,
                "detail": self.detail, "ok": self.ok}

    def record(self, net: Net) -> list[str]:
        """Read what the row's network paid and took; returns the broken books (`books`)."""
        self.miner_slashed = net.slashed()
        self.penalized = net.penalties()
        self.paid = net.paid()
        self.burned = net.state.burned
        return books(net)


def _finish(row: Row, net: Net, rounds: list[P.ChallengeResolved], *, verdict: str, payers: set[str],
            miner_pays: bool) -> Row:
    row.verdict = rounds[-1].verdict if rounds else ""
    row.rounds = len(rounds)
    broken = row.record(net)
    row.expected_payers = tuple(sorted(payers))
    row.detail = "; ".join([*broken, *(f"round {r.round}: {r.verdict} ({r.reason})" for r in rounds)])[:600]
    row.ok = (
        row.verdict == verdict
        and set(row.penalized) == payers
        and (row.miner_slashed > 0) == miner_pays
        and not broken
    )
    return row


def row_lazy_verifier() -> Row:
    row = Row(
        "lazy verifier",
        "one committee member reveals H(leaf t) read off the chain, with a made-up proof",
        "honest; the lazy verifier is outside the winning cluster and pays",
    )
    net = Net(_params())
    vs = {f"v{i}": 100 for i in range(5)}
    first = setup(net, vs)
    lazy = first.committee[0]
    rounds = play_challenge(net, first, lambda r: lambda n, ch, who: n.lazy_pair(ch, who) if who == lazy
                            else n.honest_pair(ch))
    return _finish(row, net, rounds, verdict="honest", payers={lazy}, miner_pays=False)


def row_sybil_garbage() -> Row:
    row = Row(
        "Sybil garbage",
        "three fresh accounts, each with the least bond, reveal the same garbage pair "
        "against four honest replayers holding more stake (every seat unit sits: 12 honest seats, 3 Sybil)",
        "honest; every Sybil pays",
    )
    net = Net(_params(committee_size=15))
    bonds = {f"h{i}": 300 for i in range(4)} | {f"s{i}": 100 for i in range(3)}
    first = setup(net, bonds)
    garbage = (digest("pot/matrix/garbage/v1"), digest("pot/matrix/garbage-proof/v1"))
    rounds = play_challenge(
        net, first, lambda r: lambda n, ch, who: garbage if who.startswith("s") else n.honest_pair(ch)
    )
    return _finish(row, net, rounds, verdict="honest", payers={"s0", "s1", "s2"}, miner_pays=False)


def row_lazy_sybils_on_fraud() -> Row:
    row = Row(
        "lazy Sybils on a fraudulent step",
        "the miner forged leaf t; three lazy accounts agree with the "
        "forged leaf, two honest replayers do not",
        "fraud (after re-challenges); the lazy accounts pay",
    )
    net = Net(_params(forced_challenge_steps=(5,)), faked=frozenset({5}))
    bonds = {"h0": 100, "h1": 100, "l0": 100, "l1": 100, "l2": 100}
    first = setup(net, bonds)
    rounds = play_challenge(
        net,
        first,
        lambda r: lambda n, ch, who: n.lazy_pair(ch, who) if who.startswith("l") else n.honest_pair(ch),
    )
    return _finish(row, net, rounds, verdict="fraud", payers={"l0", "l1", "l2"}, miner_pays=True)


def _refused_in_both_windows(row: Row) -> Row:
    """Every committee member reveals the one refused value in both opening windows. On chain a
    split refusal and a stalled download look the same: that is the point of the one value."""
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    rounds = play_challenge(net, first, lambda r: lambda n, ch, who: "refuse")
    return _finish(row, net, rounds, verdict="fraud", payers=set(), miner_pays=True)


def row_split_refusals() -> Row:
    return _refused_in_both_windows(
        Row(
            "split refusals",
            "the miner serves each verifier a different malformed opening, in both opening windows",
            "fraud after the second opening window; no verifier pays",
        )
    )


def row_stalled_opening() -> Row:
    return _refused_in_both_windows(
        Row(
            "stalled opening",
            "the miner serves the opening a byte at a time: every download times out (the node "
            "reveals the one refused value)",
            "fraud after the second opening window; no verifier pays",
        )
    )


def row_prover_offline() -> Row:
    row = Row(
        "prover knocked offline for one window",
        "an honest miner's prover is unreachable for the first opening window, then back",
        "honest in the second window; nobody pays",
    )
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    rounds = play_challenge(net, first, lambda r: (lambda n, ch, who: "refuse") if r == 1 else HONEST)
    return _finish(row, net, rounds, verdict="honest", payers=set(), miner_pays=False)


def row_block_grinding(resealings: int = 16) -> Row:
    row = Row(
        "block-hash grinding",
        f"the miner forged half the steps and authors the first challenge block, "
        f"re-sealing it up to {resealings} times until its draw misses a forged step; the other seven "
        f"challenge blocks are honest (all seven miss with probability 2^-7)",
        "the ground draw misses, a draw from an honest block lands on a forged step: fraud",
    )
    faked = frozenset(range(2, 17, 2))
    net = Net(_params(challenges_per_run=8), faked=faked)
    root, size = merkle.root(net.leaves), len(net.leaves)
    # The author of the first challenge block grinds: it tries hashes until the draw misses.
    ground = None
    for attempt in range(resealings + 1):
        h = digest("pot/matrix/reseal/v1", attempt)
        if challenge_step_at(h, net.run_id, root, size, 0) not in faked:
            ground = h
            break
    # 40 seat units: the eight challenges' committees of five seats sit side by side.
    setup(net, {f"v{i}": 800 for i in range(5)}, block_hash=ground)
    rounds = play_run(net, lambda r: HONEST)
    issued = [c for c in net.issued() if c.round == 1]
    row.verdict = "fraud" if any(r.verdict == "fraud" for r in rounds) else rounds[-1].verdict
    row.rounds = len(rounds)
    broken = row.record(net)
    row.detail = "; ".join(
        [
            *broken,
            f"steps {[c.step for c in issued]}; ground draw "
            f"{'missed' if ground else 'could not miss'}; "
            + ", ".join(f"step {c.step}: {net.resolved(c.challenge_id).verdict}" for c in issued),
        ]
    )
    row.ok = (ground is not None and issued[0].step not in faked and row.verdict == "fraud"
              and row.miner_slashed > 0 and not row.penalized and len(issued) == 8
              and len({c.block for c in issued}) == 8 and not broken)
    return row


def row_copied_commitment() -> Row:
    row = Row("copied commitment", "a committee member copies another's commitment instead of replaying",
              "honest; the copier cannot open it (RevealRejected) and pays for not revealing")
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    net.block((MINER, net.opening(first)))
    copier, victim = first.committee[0], first.committee[1]
    commits, reveals = [], []
    for who in first.committee[1:]:
        c, r = net.commit(first, who, net.honest_pair(first))
        commits.append(c)
        reveals.append(r)
    victim_commit = next(c for w, c in commits if w == victim)
    commits.append((copier, CommitWitness(first.challenge_id, victim_commit.commitment)))
    net.block(*commits)
    net.until(first.commit_deadline)
    victim_reveal = next(r for w, r in reveals if w == victim)
    net.block(*reveals, (copier, victim_reveal))
    net.until(first.escalate_deadline + 1)
    rejected = any(isinstance(e, P.RevealRejected) and e.verifier == copier for e in net.events)
    row = _finish(
        row, net, [net.resolved(first.challenge_id)], verdict="honest", payers={copier}, miner_pays=False
    )
    row.ok = row.ok and rejected
    return row


def row_front_run() -> Row:
    row = Row(
        "front-run registration",
        "an account copies the miner's pending registration out of the pool "
        "and gets it into an earlier block",
        "the copy is refused (RunIdNotOwned); the miner's run registers",
    )
    net = Net(_params())
    net.block(("thief", net.registration()))
    net.block((MINER, net.registration()))
    refused = [e for e in net.events if isinstance(e, P.CallRefused) and e.origin == "thief"]
    run = net.state.runs.get(net.run_id)
    row.verdict = "refused" if refused and refused[0].refusal == "RunIdNotOwned" else "taken"
    row.detail = refused[0].reason if refused else ""
    row.ok = row.verdict == "refused" and run is not None and run.miner == MINER
    return row


def row_committee_no_show() -> Row:
    row = Row(
        "committee no-show",
        "three of five committee members never commit",
        "re-challenged with a larger committee, then honest; the absent members pay",
    )
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    absent = set(first.committee[:3])
    rounds = play_challenge(
        net,
        first,
        lambda r: (lambda n, ch, who: "absent" if who in absent else n.honest_pair(ch)) if r == 1 else HONEST,
    )
    return _finish(row, net, rounds, verdict="honest", payers=absent, miner_pays=False)


def row_slow_spec() -> Row:
    row = Row(
        "slow spec",
        "a miner registers a spec whose one-step replay cannot fit in the protocol's window",
        "refused at registration (ReplayTooSlow); an admissible large spec gets a commit window sized "
        "from its replay cost",
    )
    net = Net(_params())
    huge = net.spec(kind="gpt", vocab_size=50257, block_size=1024, n_layer=96, n_head=96, n_embd=12288)
    net.block((MINER, net.registration(huge)))
    refused = [e for e in net.events if isinstance(e, P.CallRefused)]
    row.verdict = "refused" if refused and refused[0].refusal == "ReplayTooSlow" else "registered"
    net2 = Net(_params())
    big = net2.spec(kind="gpt", vocab_size=50257, block_size=256, n_layer=12, n_head=12, n_embd=768)
    net2.block(*[(f"v{i}", BondVerifier(amount=100)) for i in range(5)])
    net2.block((MINER, net2.registration(big)), (MINER, net2.full_root()))
    net2.until(net2.number + 1)
    ch = net2.issued()[0]
    window = ch.commit_deadline - ch.opening_deadline
    need = net2.state.runs[net2.run_id].replay_blocks
    row.detail = (
        f"{refused[0].reason if refused else 'not refused'}; GPT-2 small: commit window {window} blocks "
        f"(replay needs {need})"
    )
    row.ok = row.verdict == "refused" and window >= need > net2.params.commit_window
    return row


# --- protocol v3: the findings of the v3 issue, each a row ------------------------------------------

GARBAGE = (digest("pot/matrix/garbage/v1"), digest("pot/matrix/garbage-proof/v1"))


def row_commit_flood() -> Row:
    row = Row(
        "Sybils flood the dispute round's commitments",
        "twelve least-bond accounts seated in the dispute round beside three honest replayers holding more "
        "stake send their commitments before the opening is on chain, then first in the next block; an "
        "account bonded after the draw commits too",
        "every seated account's commitment is taken whatever the order (the early ones refused NoOpening, "
        "the unseated one NotInCommittee); honest; every Sybil pays",
    )
    net = Net(_params(max_rounds=1))  # the first round is the dispute round: every seat unit sits
    bonds = {f"h{i}": 500 for i in range(3)} | {f"s{i:02d}": 100 for i in range(12)}
    first = setup(net, bonds)
    commits, reveals = _acts(
        net, first, lambda n, ch, who: GARBAGE if who.startswith("s") else n.honest_pair(ch)
    )
    sybils = [c for c in commits if c[0].startswith("s")]
    late = ("late", BondVerifier(amount=100))
    net.block(*sybils, (MINER, net.opening(first)), late)  # in block order: the commitments come first
    intruder = net.commit(first, "late", net.honest_pair(first))[0]
    net.block(*sybils, *[c for c in commits if not c[0].startswith("s")], intruder)
    net.until(first.commit_deadline)
    net.block(*reveals)
    net.until(first.escalate_deadline + 1)
    row = _finish(
        row,
        net,
        [net.resolved(first.challenge_id)],
        verdict="honest",
        payers={f"s{i:02d}" for i in range(12)},
        miner_pays=False,
    )
    taken = set(net.state.challenges[first.challenge_id].commitments)
    early, unseated = net.refusals("NoOpening"), net.refusals("NotInCommittee")
    row.detail = (f"{len(first.committee)} seats of {len(bonds)} accounts, {len(taken)} commitments taken; "
                  f"{len(early)} refused NoOpening, {len(unseated)} NotInCommittee; {row.detail}")[:600]
    row.ok = (row.ok and taken == set(bonds) and len(first.committee) == 27 and len(early) == 12
              and [e.origin for e in unseated] == ["late"])
    return row


def row_half_served_dispute() -> Row:
    row = Row(
        "forger serves half the dispute round",
        "the miner forged leaf t, stalls its first opening window, then serves exactly half the seats of "
        "every later round (the other half reveal the one refused value)",
        "a tie in the second window, re-challenged; fraud in the dispute round: the seats backing the "
        "miner's value hold no more than dispute_honest_share of its revealed seats (a refusal counts "
        "against the miner); no verifier pays",
    )
    net = Net(_params(committee_size=4, forced_challenge_steps=(5,)), faked=frozenset({5}))
    first = setup(net, {f"v{i}": 100 for i in range(4)})

    def half(n: Net, ch: P.ChallengeIssued, who: str) -> Any:
        served = sorted(set(ch.committee))[: len(set(ch.committee)) // 2]
        return n.honest_pair(ch) if who in served else "refuse"

    rounds = play_challenge(net, first, lambda r: (lambda n, ch, who: "refuse") if r == 1 else half)
    row = _finish(row, net, rounds, verdict="fraud", payers=set(), miner_pays=True)
    row.ok = (
        row.ok
        and [r.verdict for r in rounds] == ["inconclusive"] * 2 + ["fraud"]
        and "not more than the share" in rounds[-1].reason
    )
    return row


def row_dust_bonds() -> Row:
    vs = _params().verifier_stake
    row = Row(
        "dust bonds against the registry",
        f"accounts bond 1 unit each to fill the verifier registry; then {MAX_VERIFIERS} accounts bond the "
        f"least stake ({vs}), one tries to unbond down to dust, one leaves",
        "dust bonds refused (BondBelowMinimum, also an unbond leaving dust); a full registry costs "
        f"{MAX_VERIFIERS} x verifier_stake and refuses a newcomer (TooMany) only until an account empties: "
        "its slot is free again",
    )
    net = Net(_params(unbonding_delay=2))
    net.block(*[(f"dust{i}", BondVerifier(amount=1)) for i in range(16)])
    dust = net.refusals("BondBelowMinimum")
    net.block(*[(f"f{i:04d}", BondVerifier(amount=vs)) for i in range(MAX_VERIFIERS)])
    net.block(("newcomer", BondVerifier(amount=vs)), ("f0001", BondVerifier(amount=vs)))
    full = net.refusals("TooMany")
    net.block(("f0000", UnbondVerifier(amount=vs)), ("f0001", UnbondVerifier(amount=vs + 1)))
    below = net.refusals("BondBelowMinimum")[len(dust):]
    still = "f0000" in net.state.verifiers  # its unbonding amount is still held
    net.until(net.number + net.params.unbonding_delay)
    left = "f0000" not in net.state.verifiers
    net.block(("newcomer", BondVerifier(amount=vs)))
    joined = "newcomer" in net.state.verifiers
    row.verdict = "refused" if len(dust) == 16 else "taken"
    row.record(net)
    row.detail = (
        f"{len(dust)} dust bonds refused; registry {len(net.state.verifiers)} of {MAX_VERIFIERS}; "
        f"newcomer refused while full: {[e.origin for e in full]}; dust unbond refused: "
        f"{[e.origin for e in below]}; the emptied account left: {left}; the newcomer joined: {joined}"
    )
    row.ok = (len(dust) == 16 and not any(a.startswith("dust") for a in net.state.verifiers)
              and [e.origin for e in full] == ["newcomer"] and [e.origin for e in below] == ["f0001"]
              and still and left and joined and len(net.state.verifiers) == MAX_VERIFIERS)
    return row


def row_one_bond_many_committees() -> Row:
    row = Row(
        "one bond on many committees",
        "an account bonded 3 x verifier_stake is drawn for four challenges sitting side by side and never "
        "commits, against five honest replayers",
        "it never holds more seats at once than its free bond backs (bond // verifier_stake); every "
        "absence is paid in full from its seats' collateral; every challenge honest",
    )
    p = _params(challenges_per_run=4)
    net = Net(p)
    most = [0]

    def watch(n: Net) -> None:
        open_seats = sum(ch.committee.count("w") for ch in n.state.challenges.values()
                         if ch.verdict is None or ch.pending)
        most[0] = max(most[0], open_seats)
        if open_seats * p.verifier_stake > n.state.vbonds.get("w", 0):
            raise AssertionError(f"w sits on {open_seats} seats with a bond of {n.state.vbonds.get('w')}")

    setup(net, {"w": 3 * p.verifier_stake} | {f"h{i}": 400 for i in range(5)})
    watch(net)
    rounds = play_run(
        net, lambda r: lambda n, ch, who: "absent" if who == "w" else n.honest_pair(ch), watch=watch
    )
    finals = [r for r in rounds if r.rechallenge is None]
    row.verdict = "honest" if finals and all(r.verdict == "honest" for r in finals) else "not honest"
    row.rounds = len(rounds)
    broken = row.record(net)
    row.expected_payers = ("w",)
    seats = sum(ch.committee.count("w") for ch in net.state.challenges.values())
    row.detail = "; ".join([*broken, f"w held {seats} seat(s) in all, at most {most[0]} at once; "
                            f"{len(finals)} challenges: {[r.verdict for r in finals]}"])
    row.ok = (
        row.verdict == "honest"
        and len(finals) == 4
        and set(row.penalized) == {"w"}
        and 1 <= most[0] <= 3
        and row.penalized["w"] == p.no_show_penalty * seats
        and not row.miner_slashed
        and not broken
    )
    return row


def _unlucky_hash(net: Net, bonds: dict[str, int], seats: int, want: Callable[[list[str]], bool]) -> bytes:
    """A block hash whose first-challenge draw gives a committee `want` accepts (a row's bad luck)."""
    root, size = merkle.root(net.leaves), len(net.leaves)
    units = seat_units(sorted(bonds.items()), net.params.verifier_stake)
    for attempt in range(100_000):
        h = digest("pot/matrix/bad-luck/v1", attempt)
        if want(draw_committee(h, derive_challenge_id(net.run_id, root, size, 0, h), units, seats)):
            return h
    raise RuntimeError("no block hash gives the committee the row needs")


def row_lazy_majority_escalated() -> Row:
    row = Row(
        "coordinated lazy majority, escalated",
        "the miner forged leaf t; two lazy accounts holding the least bond share one made-up value agreeing "
        "with the forged leaf and hold two of round 1's three seats; the honest seat escalates",
        "round 1 would pass the forged leaf; the dispute round (the whole stake) judges fraud; the lazy "
        "accounts pay an outlier penalty a seat in round 1 and in the dispute; the escalator gets its stake "
        "back",
    )
    p = _params(committee_size=3, quorum_min_reveals=2, forced_challenge_steps=(5,))
    net = Net(p, faked=frozenset({5}))
    bonds = {"h0": 1000, "h1": 1000, "h2": 1000, "l0": 100, "l1": 100}
    shared = digest("pot/matrix/made-up/v1")
    h = _unlucky_hash(net, bonds, 3, lambda c: sorted(c)[1:] == ["l0", "l1"])
    first = setup(net, bonds, block_hash=h)
    lazy = lambda n, ch, who: (witness_value_hash(n.leaves[ch.step]), shared) if who.startswith("l") \
        else n.honest_pair(ch)  # noqa: E731
    rounds = play_challenge(net, first, lambda r: lazy)
    settled = [e for e in net.events if isinstance(e, P.EscalationSettled)]
    escalated = [e for e in net.events if isinstance(e, P.ChallengeEscalated)]
    row = _finish(row, net, rounds, verdict="fraud", payers={"l0", "l1"}, miner_pays=True)
    row.ok = (row.ok and [r.round for r in rounds] == [1, p.max_rounds] and len(escalated) == 1
              and [(e.verifier, e.returned, e.forfeited) for e in settled]
              == [(escalated[0].verifier, p.escalation_stake, 0)]
              and row.penalized == {"l0": 2 * p.outlier_penalty, "l1": 2 * p.outlier_penalty})
    return row


def row_split_stake_dispute(samples: int = 256) -> Row:
    row = Row(
        "stake split for dispute seats",
        "a coalition holds 1000 seat units of 5000 (the dispute round's 4096 seats are proportional): once "
        "as one account, once split over 1000 least-bond accounts",
        "the same seats either way: floor or ceiling of its exact share 819.2 at every draw, the share on "
        "average (proportional seats, one systematic lottery for the remainders)",
    )
    vs = _params().verifier_stake
    exact = Fraction(1000 * MAX_DISPUTE_SEATS, 5000)
    coalitions = {"one account": {"c": 1000 * vs}, "split": {f"c{i:04d}": vs for i in range(1000)}}
    seats, means = {}, {}
    for how, coalition in coalitions.items():
        net = Net(_params(max_rounds=1))  # the first round is the dispute round
        first = setup(net, {"h": 4000 * vs} | coalition)
        seats[how] = sum(1 for a in first.committee if a.startswith("c"))
        units = seat_units(sorted(({"h": 4000 * vs} | coalition).items()), vs)
        draws = [
            sum(
                1
                for a in dispute_seats(
                    digest("pot/matrix/lottery/v1", k), first.challenge_id, units, MAX_DISPUTE_SEATS
                )
                if a.startswith("c")
            )
            for k in range(samples)
        ]
        means[how] = Fraction(sum(draws), samples)
        seats[how + " range"] = (min(draws), max(draws))
        assert len(first.committee) == MAX_DISPUTE_SEATS
    row.verdict = "no gain"
    row.detail = (
        f"seats on chain: one account {seats['one account']}, split {seats['split']}; over {samples} draws "
        f"one account {seats['one account range']} mean {float(means['one account']):.3f}, split "
        f"{seats['split range']} mean {float(means['split']):.3f}; exact share {float(exact)}"
    )
    lo, hi = exact.numerator // exact.denominator, -(-exact.numerator // exact.denominator)
    row.ok = (all(lo <= seats[k] <= hi for k in coalitions)
              and all(lo <= a and b <= hi for a, b in (seats[k + " range"] for k in coalitions))
              and all(abs(means[k] - exact) < Fraction(1, 10) for k in coalitions))
    return row


def row_seat_withholder() -> Row:
    row = Row("one withheld seat against the quorum",
              "four seats, quorum_min_reveals 3: an honest account holds two seats, another one; the fourth "
              "seat's account commits and never reveals",
              "honest in round 1: the quorum counts revealed seats (3), so withholding takes away one seat, "
              "not more; the withholder pays for its seat")
    net = Net(_params(committee_size=4, quorum_min_reveals=3))
    first = setup(net, {"a": 200, "b": 100, "w": 100})
    rounds = play_challenge(
        net, first, lambda r: lambda n, ch, who: "silent" if who == "w" else n.honest_pair(ch)
    )
    row = _finish(row, net, rounds, verdict="honest", payers={"w"}, miner_pays=False)
    row.ok = (row.ok and sorted(first.committee) == ["a", "a", "b", "w"] and rounds[0].cluster_size == 3
              and row.penalized == {"w": net.params.no_show_penalty})
    return row


ROWS: dict[str, Callable[[], Row]] = {
    "lazy": row_lazy_verifier,
    "sybil": row_sybil_garbage,
    "lazy-sybils-fraud": row_lazy_sybils_on_fraud,
    "split-refusals": row_split_refusals,
    "stalled-opening": row_stalled_opening,
    "prover-offline": row_prover_offline,
    "grinding": row_block_grinding,
    "copied-commitment": row_copied_commitment,
    "front-run": row_front_run,
    "no-show": row_committee_no_show,
    "slow-spec": row_slow_spec,
    "commit-flood": row_commit_flood,
    "half-served-dispute": row_half_served_dispute,
    "dust-bonds": row_dust_bonds,
    "one-bond-many-committees": row_one_bond_many_committees,
    "lazy-majority-escalated": row_lazy_majority_escalated,
    "split-stake": row_split_stake_dispute,
    "seat-withholder": row_seat_withholder,
}


def run_matrix(only: list[str] | None = None) -> list[Row]:
    names = list(ROWS) if not only else only
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise ValueError(f"unknown row(s) {', '.join(unknown)}; known: {', '.join(ROWS)}")
    return [ROWS[n]() for n in names]


def format_matrix(rows: list[Row]) -> str:
    lines = ["| row | expected | verdict | rounds | miner slashed | verifiers penalised | ok |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        pen = ", ".join(f"{k} {v}" for k, v in sorted(r.penalized.items())) or "none"
        lines.append(f"| {r.name} | {r.expect} | {r.verdict} | {r.rounds} | {r.miner_slashed} | {pen} | "
                     f"{'yes' if r.ok else 'NO'} |")
    return "\n".join(lines)


__all__ = ["ROWS", "Net", "Row", "books", "dissent", "format_matrix", "never", "play_challenge", "play_round",
           "play_run", "run_matrix", "setup"]
