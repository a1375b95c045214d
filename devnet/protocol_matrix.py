"""The protocol's adversary matrix: every strategy an actor of the network might play for gain,
each run through the real protocol state machine (`chain.protocol`), with the outcome the protocol
must give and exactly who pays. `pot redteam --protocol` prints it; tests/chain/test_adversary_matrix.py
asserts every row.

A row builds its own small network in memory: bonded verifiers, a miner and a synthetic run whose
leaves are real step leaves over made-up state digests (what the protocol checks — Merkle proofs,
leaf format, H(leaf t), the witness pair — is exactly what it checks for a real run; the replay
itself is the node's business and has its own tests). Honest verifiers reveal the pair a replay
gives: H(true leaf t) and the true post-state's proof, modelled as one secret per challenge that
only replayers know. Block hashes are chosen by the row, so that grinding can be played too.

The invariants every row checks: fraud is caught or re-challenged, an honest miner is never
slashed, and lazy or Sybil accounts lose bond.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chain import protocol as P
from chain.calls import (
    BondVerifier,
    CommitWitness,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    derive_run_id,
)
from chain.transport import Block
from challenges.derive import challenge_step_at
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
        return step_leaf(t, digest("pot/matrix/state/v1", kind if t else "true", t), 0x40000000 + t if t else 0)

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
            run_id=self.run_id, nonce=self.nonce, initial_hash=digest("pot/matrix/init/v1"),
            schedule_commitment=digest("pot/matrix/schedule/v1"), dataset_hash=digest("pot/matrix/dataset/v1"),
            spec=(spec or self.spec()).to_cbor(), declared_steps=self.steps, endpoint="http://miner.matrix:8000")

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
        return (who, CommitWitness(ch.challenge_id, com)), (who, RevealWitnessValue(ch.challenge_id, value, proof,
                                                                                     bucket, salt))

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


# A verifier's behaviour for one round: a pair to reveal, "refuse", "absent" (no commit), or
# "silent" (commits, never reveals).
Behaviour = Callable[[Net, P.ChallengeIssued, str], Any]


def play_round(net: Net, ch: P.ChallengeIssued, behave: Behaviour, *, open_it: bool = True) -> P.ChallengeResolved:
    """One round of one challenge: the miner opens it (or not), each committee member does what
    `behave` says, and the blocks run until the round resolves."""
    if open_it:
        net.block((MINER, net.opening(ch)))
    commits, reveals = [], []
    for who in ch.committee:
        act = behave(net, ch, who)
        if act == "absent":
            continue
        pair = refused_pair(ch.challenge_id) if act == "refuse" else (
            net.honest_pair(ch) if act == "silent" else act)
        c, r = net.commit(ch, who, pair, REFUSED_BUCKET if act == "refuse" else 0)
        commits.append(c)
        if act != "silent":
            reveals.append(r)
    net.block(*commits)
    net.until(ch.commit_deadline)
    net.block(*reveals)
    net.until(ch.reveal_deadline + 1)
    return net.resolved(ch.challenge_id)


def play_challenge(net: Net, first: P.ChallengeIssued, behave_by_round: Callable[[int], Behaviour], *,
                   open_by_round: Callable[[int], bool] = lambda r: True) -> list[P.ChallengeResolved]:
    """Every round of a challenge until one ends it (no re-challenge)."""
    rounds, ch = [], first
    while True:
        res = play_round(net, ch, behave_by_round(ch.round), open_it=open_by_round(ch.round))
        rounds.append(res)
        if res.rechallenge is None:
            return rounds
        ch = next(e for e in net.issued() if e.challenge_id == res.rechallenge)


def setup(net: Net, bonds: dict[str, int]) -> P.ChallengeIssued:
    net.block(*[(v, BondVerifier(amount=b)) for v, b in bonds.items()])
    net.block((MINER, net.registration()), (MINER, net.full_root()))
    net.until(net.number + net.params.challenge_delay)
    issued = net.issued()
    assert issued, "no challenge was issued"
    return issued[0]


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
    detail: str = ""
    ok: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"row": self.name, "strategy": self.strategy, "expect": self.expect, "verdict": self.verdict,
                "rounds": self.rounds, "miner_slashed": self.miner_slashed, "penalized": self.penalized,
                "expected_payers": list(self.expected_payers), "detail": self.detail, "ok": self.ok}


def _finish(row: Row, net: Net, rounds: list[P.ChallengeResolved], *, verdict: str, payers: set[str],
            miner_pays: bool) -> Row:
    row.verdict = rounds[-1].verdict if rounds else ""
    row.rounds = len(rounds)
    row.miner_slashed = net.slashed()
    row.penalized = net.penalties()
    row.expected_payers = tuple(sorted(payers))
    row.detail = "; ".join(f"round {r.round}: {r.verdict} ({r.reason})" for r in rounds)[:600]
    row.ok = (row.verdict == verdict and set(row.penalized) == payers and (row.miner_slashed > 0) == miner_pays)
    return row


def row_lazy_verifier() -> Row:
    row = Row("lazy verifier", "one committee member reveals H(leaf t) read off the chain, with a made-up proof",
              "honest; the lazy verifier is outside the winning cluster and pays")
    net = Net(_params())
    vs = {f"v{i}": 100 for i in range(5)}
    first = setup(net, vs)
    lazy = first.committee[0]
    rounds = play_challenge(net, first, lambda r: lambda n, ch, who: n.lazy_pair(ch, who) if who == lazy
                            else n.honest_pair(ch))
    return _finish(row, net, rounds, verdict="honest", payers={lazy}, miner_pays=False)


def row_sybil_garbage() -> Row:
    row = Row("Sybil garbage", "three fresh accounts, each with the least bond, reveal the same garbage pair "
              "against four honest replayers holding more stake", "honest; every Sybil pays")
    net = Net(_params(committee_size=7))
    bonds = {f"h{i}": 300 for i in range(4)} | {f"s{i}": 100 for i in range(3)}
    first = setup(net, bonds)
    garbage = (digest("pot/matrix/garbage/v1"), digest("pot/matrix/garbage-proof/v1"))
    rounds = play_challenge(net, first, lambda r: lambda n, ch, who: garbage if who.startswith("s") else n.honest_pair(ch))
    return _finish(row, net, rounds, verdict="honest", payers={"s0", "s1", "s2"}, miner_pays=False)


def row_lazy_sybils_on_fraud() -> Row:
    row = Row("lazy Sybils on a fraudulent step", "the miner forged leaf t; three lazy accounts agree with the "
              "forged leaf, two honest replayers do not", "fraud (after re-challenges); the lazy accounts pay")
    net = Net(_params(forced_challenge_steps=(5,)), faked=frozenset({5}))
    bonds = {"h0": 100, "h1": 100, "l0": 100, "l1": 100, "l2": 100}
    first = setup(net, bonds)
    rounds = play_challenge(net, first, lambda r: lambda n, ch, who: n.lazy_pair(ch, who) if who.startswith("l")
                            else n.honest_pair(ch))
    return _finish(row, net, rounds, verdict="fraud", payers={"l0", "l1", "l2"}, miner_pays=True)


def _refused_in_both_windows(row: Row) -> Row:
    """Every committee member reveals the one refused value in both opening windows. On chain a
    split refusal and a stalled download look the same: that is the point of the one value."""
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    rounds = play_challenge(net, first, lambda r: lambda n, ch, who: "refuse")
    return _finish(row, net, rounds, verdict="fraud", payers=set(), miner_pays=True)


def row_split_refusals() -> Row:
    return _refused_in_both_windows(Row(
        "split refusals", "the miner serves each verifier a different malformed opening, in both opening windows",
        "fraud after the second opening window; no verifier pays"))


def row_stalled_opening() -> Row:
    return _refused_in_both_windows(Row(
        "stalled opening", "the miner serves the opening a byte at a time: every download times out (the node "
        "reveals the one refused value)", "fraud after the second opening window; no verifier pays"))


def row_prover_offline() -> Row:
    row = Row("prover knocked offline for one window", "an honest miner's prover is unreachable for the first "
              "opening window, then back", "honest in the second window; nobody pays")
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    rounds = play_challenge(net, first, lambda r: (lambda n, ch, who: "refuse") if r == 1 else HONEST)
    return _finish(row, net, rounds, verdict="honest", payers=set(), miner_pays=False)


def row_block_grinding(resealings: int = 16) -> Row:
    row = Row("block-hash grinding", f"the miner forged half the steps and authors the first challenge block, "
              f"re-sealing it up to {resealings} times until its draw misses a forged step; the other blocks "
              f"are honest", "the ground draw misses, a draw from an honest block lands on a forged step: fraud")
    faked = frozenset(range(2, 17, 2))
    net = Net(_params(challenges_per_run=4), faked=faked)
    net.block(*[(f"v{i}", BondVerifier(amount=100)) for i in range(5)])
    net.block((MINER, net.registration()), (MINER, net.full_root()))
    root, size = merkle.root(net.leaves), len(net.leaves)
    # The author of the first challenge block grinds: it tries hashes until the draw misses.
    ground = None
    for attempt in range(resealings + 1):
        h = digest("pot/matrix/reseal/v1", attempt)
        if challenge_step_at(h, net.run_id, root, size, 0) not in faked:
            ground = h
            break
    net.block(block_hash=ground)
    net.until(net.number + 3)
    issued = net.issued()
    rounds: list[P.ChallengeResolved] = []
    for ch in issued:
        rounds += play_challenge(net, ch, lambda r: HONEST)
    row.verdict = "fraud" if any(r.verdict == "fraud" for r in rounds) else rounds[-1].verdict
    row.rounds = len(rounds)
    row.miner_slashed = net.slashed()
    row.penalized = net.penalties()
    row.detail = (f"steps {[c.step for c in issued]}; ground draw {'missed' if ground else 'could not miss'}; "
                  + ", ".join(f"step {c.step}: {net.resolved(c.challenge_id).verdict}" for c in issued))
    row.ok = (ground is not None and issued[0].step not in faked and row.verdict == "fraud"
              and row.miner_slashed > 0 and not row.penalized and len(issued) == 4)
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
    net.until(first.reveal_deadline + 1)
    rejected = any(isinstance(e, P.RevealRejected) and e.verifier == copier for e in net.events)
    row = _finish(row, net, [net.resolved(first.challenge_id)], verdict="honest", payers={copier}, miner_pays=False)
    row.ok = row.ok and rejected
    return row


def row_front_run() -> Row:
    row = Row("front-run registration", "an account copies the miner's pending registration out of the pool "
              "and gets it into an earlier block", "the copy is refused (RunIdNotOwned); the miner's run registers")
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
    row = Row("committee no-show", "three of five committee members never commit", "re-challenged with a larger "
              "committee, then honest; the absent members pay")
    net = Net(_params())
    first = setup(net, {f"v{i}": 100 for i in range(5)})
    absent = set(first.committee[:3])
    rounds = play_challenge(net, first, lambda r: (lambda n, ch, who: "absent" if who in absent else n.honest_pair(ch))
                            if r == 1 else HONEST)
    return _finish(row, net, rounds, verdict="honest", payers=absent, miner_pays=False)


def row_slow_spec() -> Row:
    row = Row("slow spec", "a miner registers a spec whose one-step replay cannot fit in the protocol's window",
              "refused at registration (ReplayTooSlow); an admissible large spec gets a commit window sized "
              "from its replay cost")
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
    row.detail = (f"{refused[0].reason if refused else 'not refused'}; GPT-2 small: commit window {window} blocks "
                  f"(replay needs {need})")
    row.ok = row.verdict == "refused" and window >= need > net2.params.commit_window
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


__all__ = ["ROWS", "Net", "Row", "format_matrix", "play_challenge", "play_round", "run_matrix", "setup"]
