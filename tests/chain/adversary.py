"""An adversary game over the real protocol state machine, for property tests.

A `Scenario` names the accounts (honest replayers and a coalition, each with its bond), the miner
(honest: true leaves, the opening on chain and served to every seat; or a forger, whose committed
leaves are not the true ones, which serves the opening to some seats, to half of them, to none, or
puts none on chain), and how the coalition plays (lazy guesses, one shared made-up value, the
miner's value, withholding its commitment or its reveal, refusing, telling the truth, each account
its own way) and whether it escalates. `play` runs it block by block on a PureChain until every
run is settled: every call lands at a block inside its window, chosen by `rng`, and the calls of a
block arrive in an order `rng` chooses. Honest seats commit after the opening is on chain, reveal
what they replayed (or the refused value when the miner did not serve them) and escalate when they
revealed the true value and the round's winning value is another.

`check_books` checks what must hold of any state the game reaches: every penalty is the rule's
amount, no bond is negative, reservations are exactly what open rounds and escalations hold and
never exceed the bond, and every unit deposited is held, released or burned.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from chain.calls import EscalateChallenge, UnbondVerifier
from chain.protocol import ProtocolParams, apply_recorded, escalation_room, on_block, round_result
from chain.protocol.events import (
    BondReleased,
    CallRefused,
    ChallengeIssued,
    ChallengeResolved,
    RunRegistered,
    RunSettled,
    VerifierBonded,
    VerifierPenalized,
)
from chain.transport import Block
from challenges.refused import REFUSED_BUCKET, refused_value_hash
from commitments.hashing import digest
from commitments.leaves import step_leaf, witness_value_hash
from tests.chain.puretest import PureChain
from tests.chain.runs import SyntheticRun, bond, proof, witness

PLAYS = ("lazy", "shared", "miner", "withhold_commit", "withhold_reveal", "refuse", "truth")
SERVES = ("all", "none", "half", "random", "absent")  # a forger's choice, per round


@dataclass(frozen=True)
class Scenario:
    params: ProtocolParams
    honest: tuple[int, ...]  # the bonds of the honest replayers h0, h1, ...
    coalition: tuple[int, ...]  # the bonds of the coalition's accounts c0, c1, ...
    forged: bool = False  # the miner's committed leaves 1..T are not the true ones
    play: str = "shared"  # the coalition's play (PLAYS), or "mixed": each account its own
    escalates: bool = False  # the coalition escalates every round it can
    serve: tuple[str, ...] = ("all",)  # a forger's serving, round by round (the last repeats)
    steps: int = 8
    unbonds: bool = False  # coalition accounts unbond parts of their bond at random blocks

    @property
    def accounts(self) -> dict[str, int]:
        out = {f"h{i}": s for i, s in enumerate(self.honest)}
        out.update({f"c{i}": s for i, s in enumerate(self.coalition)})
        return out


@dataclass
class Round:
    """What the game knows of one round: its issuance, the opening's block, whom the miner serves."""

    issued: ChallengeIssued
    seats: Counter
    opening_block: int | None
    served: frozenset[str]
    plays: dict[str, str]
    values: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # account -> (value, proof)


@dataclass
class Game:
    scenario: Scenario
    chain: PureChain
    run: SyntheticRun
    truth: list[bytes]  # the true leaves
    rounds: dict[bytes, Round] = field(default_factory=dict)
    honest_refusals: list[CallRefused] = field(default_factory=list)
    # (challenge id, account, refusal code) of every refused escalation
    escalation_refusals: list[tuple[bytes, str, str]] = field(default_factory=list)
    watched: set[bytes] = field(default_factory=set)  # rounds whose wrong verdict the honest accounts saw

    def true_value(self, step: int) -> bytes:
        return witness_value_hash(self.truth[step])


def _serve_set(kind: str, seats: Counter, rng: random.Random) -> frozenset[str] | None:
    """The accounts a forger serves (None: no opening on chain)."""
    if kind == "absent":
        return None
    accounts = sorted(seats)
    if kind == "all":
        return frozenset(accounts)
    if kind == "none":
        return frozenset()
    if kind == "random":
        return frozenset(a for a in accounts if rng.random() < 0.5)
    # "half": accounts holding as close to half of the seats as the seats allow, from below
    target, got, out = sum(seats.values()) / 2, 0, set()
    rng.shuffle(accounts)
    for a in accounts:
        if got + seats[a] <= target:
            out.add(a)
            got += seats[a]
    return frozenset(out)


def _plan(game: Game, ev: ChallengeIssued, rng: random.Random, plan: dict[int, list]) -> None:
    """Schedule every call of a new round: the opening, commits, reveals and escalations."""
    sc, run, cid = game.scenario, game.run, ev.challenge_id
    seats = Counter(ev.committee)
    kind = "all" if not sc.forged else sc.serve[min(ev.round, len(sc.serve)) - 1]
    served = _serve_set(kind, seats, rng)
    opening_block = None
    if served is not None:
        opening_block = rng.randint(ev.block + 1, ev.opening_deadline)
        plan.setdefault(opening_block, []).append(("miner", run.opening(cid, ev.step)))
    plays = {a: (sc.play if sc.play != "mixed" else rng.choice(PLAYS)) for a in seats if a.startswith("c")}
    rnd = Round(ev, seats, opening_block, served or frozenset(), plays)
    game.rounds[cid] = rnd
    if opening_block is None:
        return  # nothing to replay: the round resolves as fraud at its opening deadline
    refused = refused_value_hash(cid)
    for a in sorted(seats):
        if a.startswith("h"):
            value = (game.true_value(ev.step), proof(cid)) if a in rnd.served else (refused, refused)
            reveal, escalate = True, False  # honest accounts escalate by watching (play)
        else:
            play = plays[a]
            if play == "withhold_commit":
                continue
            value = {
                "lazy": (
                    digest("pot/test/lazy/v1", cid, a, rng.getrandbits(64)),
                    digest("pot/test/lazy/v1", a),
                ),
                "shared": (digest("pot/test/made-up/v1", ev.first or cid), proof(cid)),
                "miner": (run.value_hash(ev.step), proof(cid)),
                "withhold_reveal": (digest("pot/test/made-up/v1", ev.first or cid), proof(cid)),
                "refuse": (refused, refused),
                "truth": (game.true_value(ev.step), proof(cid)),
            }[play]
            reveal, escalate = play != "withhold_reveal", sc.escalates
        rnd.values[a] = value
        bucket = REFUSED_BUCKET if value[0] == refused else 0
        com, rev = witness(cid, a, value[0], bucket, proof_hash=value[1])
        plan.setdefault(rng.randint(opening_block + 1, ev.commit_deadline), []).append((a, com))
        if reveal:
            plan.setdefault(rng.randint(ev.commit_deadline + 1, ev.reveal_deadline), []).append((a, rev))
            if escalate and ev.escalate_deadline > ev.reveal_deadline:
                at = rng.randint(ev.reveal_deadline + 1, ev.escalate_deadline)
                plan.setdefault(at, []).append((a, EscalateChallenge(cid)))


def forged_run(steps: int) -> tuple[SyntheticRun, list[bytes]]:
    """A run whose committed leaves 1..T are made up, and its true leaves."""
    run = SyntheticRun(steps=steps)
    truth = list(run.leaves)
    run.leaves = [truth[0]] + [step_leaf(t, digest("pot/test/forged/v1", t), 0x40000000 + t)
                               for t in range(1, steps + 1)]
    return run, truth


def _block(chain: PureChain, calls: list) -> list[list]:
    """PureChain.block with refusals recorded, returning each call's own events (a refusal names
    no challenge, so the game learns which call it answered from here)."""
    chain.number += 1
    blk = Block(chain.number, digest("pot/test/block/v1", chain.number), tuple(calls))
    chain.events += on_block(chain.state, blk)
    out = []
    for origin, call in calls:
        evs = apply_recorded(chain.state, call, origin, blk)
        chain.events += evs
        out.append(evs)
    return out


def play(sc: Scenario, rng: random.Random, *, max_blocks: int = 2000) -> Game:
    """Play the scenario until the run is settled (or `max_blocks`, an error)."""
    chain = PureChain(sc.params)
    if sc.forged:
        run, truth = forged_run(sc.steps)
    else:
        run = SyntheticRun(steps=sc.steps)
        truth = list(run.leaves)
    game = Game(sc, chain, run, truth)
    bonds = [(a, bond(s)) for a, s in sc.accounts.items()]
    rng.shuffle(bonds)
    chain.block(("miner", run.register()), *bonds)
    chain.block(("miner", run.submit_full_root()))
    plan: dict[int, list] = {}
    seen = 0
    while not chain.state.runs[run.run_id].settled:
        if chain.number >= max_blocks:
            raise AssertionError(f"the run is not settled after {max_blocks} blocks")
        calls = plan.pop(chain.number + 1, [])
        if sc.unbonds and sc.coalition and rng.random() < 0.2:
            a = f"c{rng.randrange(len(sc.coalition))}"
            free = chain.state.vbonds.get(a, 0) - chain.state.reserved.get(a, 0)
            if free > 0:  # all of it, or some: a refusal (below the minimum, reserved) is part of the game
                calls.append((a, UnbondVerifier(rng.choice([free, rng.randint(1, free)]))))
        calls += _honest_escalations(game, chain.number + 1)
        rng.shuffle(calls)
        for (origin, call), evs in zip(calls, _block(chain, calls), strict=True):
            for ev in evs:
                if isinstance(ev, CallRefused) and isinstance(call, EscalateChallenge):
                    game.escalation_refusals.append((call.challenge_id, origin, ev.refusal))
                elif isinstance(ev, CallRefused) and origin.startswith("h"):
                    game.honest_refusals.append(ev)
        for ev in chain.events[seen:]:
            if isinstance(ev, ChallengeIssued):
                _plan(game, ev, rng, plan)
        seen = len(chain.events)
        check_books(game)
    return game


def _honest_escalations(game: Game, n: int) -> list:
    """Honest accounts watch every round: in each block of its escalation window, while the verdict
    its reveals give is wrong (fraud on a true step, honest on a forged one) and no honest
    escalation is on record, every honest account (seated or not) with the room escalates it, as
    each honest node does on its own. The room is read before the block, whose own work (a new
    round's seats) may still take it: the chain then refuses, and the account tries again in the
    next block of the window. An account without the room is recorded as refused for it."""
    state, p = game.chain.state, game.scenario.params
    calls = []
    for cid, ch in state.challenges.items():
        if ch.dispute or ch.verdict is not None or not ch.reveal_deadline < n <= ch.escalate_deadline:
            continue
        if any(a.startswith("h") for a in ch.escalations):
            continue
        result = round_result(state, cid)
        final = result.verdict in ("honest", "fraud") or (
            result.verdict == "refused" and ch.refused_rounds > 0
        )
        says_fraud = result.verdict != "honest"
        if not final or says_fraud == game.scenario.forged:
            continue
        game.watched.add(cid)
        for a in sorted(x for x in state.vbonds if x.startswith("h")):
            if escalation_room(state, a) >= p.escalation_stake:
                calls.append((a, EscalateChallenge(cid)))
            else:
                game.escalation_refusals.append((cid, a, "InsufficientFreeBond"))
    return calls


def drain(game: Game) -> None:
    """Every account unbonds all of its bond, and the chain runs until every amount is released."""
    chain = game.chain
    calls = [(a, UnbondVerifier(b)) for a, b in sorted(chain.state.vbonds.items()) if b > 0]
    chain.block(*calls)
    chain.advance_to(chain.number + game.scenario.params.unbonding_delay + 1)
    check_books(game)


def why_wrong(game: Game, cid: bytes) -> str:
    """Why a round judged against the truth: "no honest account" (none could escalate), "no free
    bond" (none had the escalation room), "honest minority of the dispute seats" (a dispute round
    whose seats, capped by what each account may still be charged, the honest side did not hold a
    majority of), or "judged wrong" (anything else: a protocol finding)."""
    rnd = game.rounds[cid]
    ch = game.chain.state.challenges[cid]
    if ch.dispute:
        # A dispute round seats every unit of bond less what an account's escalation stakes and its
        # seats on other open rounds could still be charged (state.dispute_bonds): the guarantee is
        # a majority of those seats, which the honest side may lack by that cap or a unit's rounding.
        honest = sum(1 for a in ch.committee if a.startswith("h"))
        return "judged wrong" if 2 * honest > len(ch.committee) else "honest minority of the dispute seats"
    truth = game.true_value(rnd.issued.step)
    dissent = sorted(a for a in game.chain.state.vbonds if a.startswith("h")) or \
        [a for a in rnd.seats if a.startswith("h") and rnd.values.get(a, (None,))[0] == truth]
    if not dissent:
        return "no honest account"
    codes = {a: {c for i, x, c in game.escalation_refusals if i == cid and x == a} for a in dissent}
    if all(codes[a] == {"InsufficientFreeBond"} for a in dissent):
        return "no free bond"
    return "judged wrong"


def final_verdicts(game: Game) -> dict[int, str]:
    """challenge index -> the verdict of its last round."""
    out: dict[int, tuple[int, str]] = {}
    for ev in game.chain.of(ChallengeResolved):
        rnd = game.rounds[ev.challenge_id]
        out[rnd.issued.index] = (ev.block, ev.verdict)
    return {i: v for i, (_, v) in out.items()}


def check_books(game: Game) -> None:
    """Penalties, bonds, reservations and the conservation of units (see the module's doc)."""
    chain, p = game.chain, game.scenario.params
    s = chain.state
    rule = {"no_commit": p.no_show_penalty, "no_reveal": p.no_show_penalty, "outlier": p.outlier_penalty}
    for ev in chain.of(VerifierPenalized):
        seats = game.rounds[ev.challenge_id].seats[ev.verifier]
        assert ev.amount == rule[ev.why] * seats, (
            f"{ev.verifier} paid {ev.amount} for {ev.why} on {seats} seat(s); the rule asks "
            f"{rule[ev.why] * seats}"
        )
    for a, b in s.vbonds.items():
        assert b >= 0, f"{a}'s active bond is {b}"
        assert 0 <= s.staked.get(a, 0) <= s.reserved.get(a, 0), (
            f"{a} stakes {s.staked.get(a, 0)}, reserves {s.reserved}"
        )
    assert all(r > 0 for r in s.reserved.values()), s.reserved
    held: Counter = Counter()
    for ch in s.challenges.values():
        for a, amount in ch.held.items():
            if not ch.dispute:  # a dispute round's seats hold outside `reserved`
                held[a] += amount
        for a, (_, stake) in ch.escalations.items():
            held[a] += stake
    assert +held == Counter(s.reserved), (
        f"reserved {s.reserved} != what rounds and escalations hold {dict(+held)}"
    )
    # Conservation: deposits = active + unbonding + released + the miner's held or released + burned.
    deposits = sum(e.amount for e in chain.of(VerifierBonded))
    deposits += sum(e.stake + e.escrow for e in chain.of(RunRegistered))
    out = sum(s.vbonds.values()) + sum(x[1] for w in s.unbonding.values() for x in w)
    out += sum(e.amount for e in chain.of(BondReleased))
    settled = {e.run_id: e for e in chain.of(RunSettled)}
    for run in s.runs.values():
        if run.run_id in settled:
            e = settled[run.run_id]
            out += e.stake_released + e.escrow_released
            if e.unresolved:
                out += run.stake - run.slashed  # locked
        else:
            out += run.stake - run.slashed + run.escrow_left
    out += s.burned
    assert deposits == out, f"deposits {deposits} != held, released and burned {out}"
