"""Incentives of protocol v3, measured on the real state machine: expected profit per challenge per
unit of stake of each verifier and miner strategy, with coalitions holding a share of the stake.

Every draw is one whole run played through `chain.protocol` (new_state, on_block, apply_recorded)
with blocks of this bench's own numbering and hashes, digest(BLOCK_DOMAIN, seed, scenario, draw,
number): registration, bonds, the complete root, then each block's due work and the calls the
actors make, until the run is settled (RunSettled) or MAX_BLOCKS pass. Nothing of the protocol is
modelled here: the committees, verdicts, escalations, fees, penalties and slashes are the rules'.

The network: TOTAL_UNITS seat units of stake (one unit = verifier_stake), honest accounts of
ACCOUNT_UNITS units each, plus the deviating group. "alone" is one account of ACCOUNT_UNITS units;
a coalition holds a share s of all units, in accounts of ACCOUNT_UNITS units, and acts as one (a
shared guess, a shared wrong value). The run: RUN_STEPS steps of a synthetic exact-v1 run (step
leaves over made-up state digests, as the protocol tests build them), its miner honest unless the
row is a miner's.

Verifier strategies (the miner honest):
  honest      replays each seat it holds, reveals the true pair (value hash, proof hash), watches every
              round and escalates (the first honest account with the room) a verdict that is wrong;
  lazy        does not replay; reveals the opened leaf's hash (the best guess of the value half)
              with a guessed proof half, shared by the coalition;
  noisy       replays but reveals a wrong value (the coalition's shared wrong pair); never escalates;
  sybil       honest, its stake split over SYBIL_SPLIT times as many accounts;
  withholder  commits, never reveals (and does not replay);
  griefer     does not replay, reveals a wrong value (shared) and escalates every verdict that is
              right, while it has the room.
Miner strategies: a miner that faked a share phi of its steps (the committed leaf of a faked step
is not what replaying it gives); honest verifiers; with a coalition, the coalition colludes with
the miner: it reveals the miner's own pair (the committed leaf's hash and the proof of the
miner's claimed post-state, which the miner hands it) without replaying.

Money. An account's profit is the change of its active bond over the run (fees, slash shares and
dispute pools are credited to it; penalties and forfeited escalation stakes are taken from it),
minus `replay_cost_units` for each seat it replays (--cost-per account: once per round it sits
on), divided by the run's first-round challenges and by the group's stake. The miner's profit is
what its run's settlement returns (stake and escrow released) less what it put up (stake and
escrow); its training cost is not counted, so a faking miner's saving is not either: the measured
loss beyond an honest miner's is what faking costs, and faking pays only where the compute it saves
is worth more. With a colluding coalition the miner's row is the group's: miner and coalition
together, per unit of their stakes.

Profits are printed x 10^4 (basis points of the stake per challenge) with their standard error
over the draws. A deviation is "negative" at a share when its mean plus two standard errors is
below zero (sybil: its gain over honest play at the same share; a miner: its loss beyond an honest
miner's), and the verdict names the smallest share at which it no longer is.

    PYTHONPATH=. .venv/bin/python bench/incentives.py [--draws 300] [--seed 1] [--json]
        [--replay-cost-units 1] [--cost-per seat|account]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
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
    derive_run_id,
)
from chain.protocol.cost import replay_cost, run_escrow
from chain.protocol.events import BlockWorkFailed, Event, RunSettled
from chain.transport import Block
from challenges.witness import witness_commitment
from commitments import merkle
from commitments.hashing import digest
from commitments.leaves import step_leaf, witness_value_hash
from commitments.spec import Spec

BLOCK_DOMAIN = "pot/bench/incentives/block/v1"
TOTAL_UNITS = 400  # seat units of the whole network (verifier_stake each)
ACCOUNT_UNITS = 10  # an honest account's bond, in units: enough free bond to escalate with a seat held
SYBIL_SPLIT = 5  # a Sybil's stake is held by 5x as many accounts (ACCOUNT_UNITS // 5 units each)
RUN_STEPS = 16
MAX_BLOCKS = 3000  # a run not settled by then counts as unsettled (the miner's stake as lost)
MINER = "miner"
VERIFIER_STRATEGIES = ("honest", "lazy", "noisy", "sybil", "withholder", "griefer")
MINER_FAKES = (Fraction(0), Fraction(1, 4), Fraction(1, 2), Fraction(1))
SHARES: tuple[float | None, ...] = (None, 0.05, 0.2, 0.34, 0.5)  # None: one account alone
REPLAYING = {"honest", "sybil", "noisy"}
# escalate_challenge is an attempt: a round without a winning value, or an account short of free
# bond, refuses it and nothing changes. Every other refusal is a bug of this bench.
EXPECTED_REFUSALS = {("escalate_challenge", "NotEscalable"), ("escalate_challenge", "InsufficientFreeBond")}


def share_label(s: float | None) -> str:
    return "alone" if s is None else f"s={s:g}"


def row_name(strategy: str, fake: Fraction | None) -> str:
    return strategy if fake is None else f"miner fakes {fake}"


# --- the synthetic run (what tests/chain/runs.py builds, for a bench) ---------------------------


class Run:
    """A synthetic exact-v1 run: the miner's committed step leaves, and for faked steps the leaf
    an honest replay gives instead."""

    def __init__(self, seed: str, faked: set[int]) -> None:
        self.seed, self.faked = seed, faked
        self.leaves = [step_leaf(t, digest("pot/bench/state/v1", seed, t), 0 if t == 0 else 0x40000000 + t)
                       for t in range(RUN_STEPS + 1)]
        self.true_leaves = {
            t: step_leaf(t, digest("pot/bench/true-state/v1", seed, t), 0x40000000 + t) for t in faked
        }
        self.spec = Spec.from_dict({"steps": RUN_STEPS, "profile": "exact-v1"})
        self.nonce = digest("pot/bench/run-nonce/v1", seed)[:16]
        self.run_id = derive_run_id(MINER, self.nonce)

    def register(self) -> StartTrainingCommitment:
        return StartTrainingCommitment(
            run_id=self.run_id, nonce=self.nonce, initial_hash=digest("pot/bench/state/v1", self.seed, 0),
            schedule_commitment=digest("pot/bench/schedule/v1", self.seed),
            dataset_hash=digest("pot/bench/dataset/v1", self.seed), spec=self.spec.to_cbor(),
            declared_steps=RUN_STEPS, endpoint="http://miner.bench:8000")

    def full_root(self) -> SubmitCheckpointRoot:
        return SubmitCheckpointRoot(self.run_id, merkle.root(self.leaves), len(self.leaves), [])

    def opening(self, cid: bytes, step: int) -> SubmitOpening:
        return SubmitOpening(cid, digest("pot/bench/opening/v1", cid), f"http://miner.bench:8000/o/{cid.hex()}",
                             self.leaves[step], merkle.inclusion_proof(self.leaves, step))

    def miner_pair(self, cid: bytes, step: int) -> tuple[bytes, bytes]:
        """What the miner claims: its committed leaf's hash, the proof of its claimed post-state."""
        return witness_value_hash(self.leaves[step]), digest("pot/bench/proof/v1", cid)

    def true_pair(self, cid: bytes, step: int) -> tuple[bytes, bytes]:
        """What an honest replay of the opened pre-state gives."""
        if step not in self.faked:
            return self.miner_pair(cid, step)
        return witness_value_hash(self.true_leaves[step]), digest("pot/bench/true-proof/v1", cid)


# --- one draw ------------------------------------------------------------------------------------


@dataclass
class Scenario:
    strategy: str  # a verifier strategy, or "miner"
    share: float | None
    fake: Fraction | None = None  # the miner's share of faked steps (miner rows)

    @property
    def key(self) -> str:
        return f"{row_name(self.strategy, self.fake)}|{share_label(self.share)}"


@dataclass
class Network:
    honest: dict[str, int]  # account -> bond
    group: dict[str, int]  # the deviating accounts -> bond
    role: str  # what the group does

    @property
    def group_stake(self) -> int:
        return sum(self.group.values())


def build_network(sc: Scenario, unit: int) -> Network:
    units = ACCOUNT_UNITS if sc.share is None else max(1, round(sc.share * TOTAL_UNITS))
    size = ACCOUNT_UNITS // SYBIL_SPLIT if sc.strategy == "sybil" else ACCOUNT_UNITS
    group = _accounts("c", units, size, unit)
    honest = _accounts("h", TOTAL_UNITS - units, ACCOUNT_UNITS, unit)
    role = "colluder" if sc.strategy == "miner" else sc.strategy
    if sc.strategy == "miner" and sc.share is None:
        group = {}  # a miner alone: every verifier is honest
        honest = _accounts("h", TOTAL_UNITS, ACCOUNT_UNITS, unit)
    return Network(honest, group, role)


def _accounts(prefix: str, units: int, size: int, unit: int) -> dict[str, int]:
    out: dict[str, int] = {}
    i = 0
    while units > 0:
        k = min(size, units)
        out[f"{prefix}{i:03d}"] = k * unit
        units -= k
        i += 1
    return out


@dataclass
class Outcome:
    group: float = 0.0  # the group's profit (bond change less costs), protocol units
    group_paid: int = 0
    honest: float = 0.0  # the honest accounts' profit, together
    honest_stake: int = 0
    miner: int = 0  # released less put up
    stake_lost: int = 0
    fees: int = 0  # escrow paid out to seats
    escrow_burned: int = 0
    slashed: bool = False
    settled: bool = False
    rounds: int = 0
    disputes: int = 0
    escalations: int = 0
    starved: int = 0  # escalations refused for want of free bond (InsufficientFreeBond)
    unresolved: int = 0  # challenges left unresolved after their dispute round
    challenges: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def play(sc: Scenario, draw: int, seed: int, params: P.ProtocolParams, replay_cost_units: float,
         cost_per: str) -> Outcome:
    """One whole run of scenario `sc` on the real state machine; the accounts' money before and after."""
    net = build_network(sc, params.verifier_stake)
    rng = random.Random(f"{seed}/{sc.key}/{draw}")
    fake = sc.fake or Fraction(0)
    faked = set(rng.sample(range(1, RUN_STEPS + 1), round(fake * RUN_STEPS)))
    run = Run(f"bench-{seed}-{draw}", faked)
    role = {a: "honest" for a in net.honest} | {a: net.role for a in net.group}
    cost: Counter = Counter()
    state = P.new_state(params)
    n = 0

    def block(calls: list[tuple[str, Any]]) -> list[Event]:
        nonlocal n
        n += 1
        events = P.on_block(state, Block(n, digest(BLOCK_DOMAIN, seed, sc.key, draw, n)))
        for origin, call in calls:
            events += P.apply_recorded(state, call, origin, n)
        for ev in events:
            if isinstance(ev, P.CallRefused) and (ev.call, ev.refusal) not in EXPECTED_REFUSALS:
                raise RuntimeError(f"{sc.key} draw {draw} block {n}: {ev.origin}'s {ev.call} refused: "
                                   f"{ev.refusal}: {ev.reason}")
            if isinstance(ev, BlockWorkFailed):
                raise RuntimeError(f"{sc.key} draw {draw} block {n}: the protocol's {ev.stage} work failed "
                                   f"({ev.error_type})")
        return events

    block(
        [
            (MINER, run.register()),
            *((a, BondVerifier(amount=b)) for a, b in {**net.honest, **net.group}.items()),
        ]
    )
    before = dict(state.vbonds)
    paid_before = dict(state.paid)
    block([(MINER, run.full_root())])
    out = Outcome(honest_stake=sum(net.honest.values()))
    settled: RunSettled | None = None
    pending: list[tuple[str, Any]] = []
    while settled is None and n < MAX_BLOCKS:
        for ev in block(pending):
            if isinstance(ev, RunSettled):
                settled = ev
            elif isinstance(ev, P.MinerSlashed):
                out.slashed = True
            elif isinstance(ev, P.ChallengeIssued):
                out.rounds += 1
                out.challenges += ev.round == 1
            elif isinstance(ev, P.ChallengeEscalated):
                out.escalations += 1
            elif isinstance(ev, P.CallRefused) and ev.refusal == "InsufficientFreeBond":
                out.starved += 1
        pending = _actions(state, run, role, n + 1, cost, replay_cost_units, cost_per)
    r = state.runs[run.run_id]
    out.disputes = sum(1 for c in r.challenges if state.challenges[c].dispute)
    if settled is not None:
        out.settled = True
        out.stake_lost = r.stake - settled.stake_released
        out.escrow_burned = settled.escrow_burned
        out.unresolved = settled.unresolved
        out.fees = r.escrow - settled.escrow_released - settled.escrow_burned
        out.miner = settled.stake_released + settled.escrow_released - r.stake - r.escrow
        if any(state.reserved.values()):
            raise RuntimeError(
                f"{sc.key} draw {draw}: bond still reserved after the run settled: {state.reserved}"
            )
    else:  # still open: the stake and the escrow are not the miner's
        out.stake_lost, out.miner = r.stake, -(r.stake + r.escrow)
    for a in net.group:
        out.group += state.vbonds.get(a, 0) - before[a] - cost[a]
        out.group_paid += state.paid.get(a, 0) - paid_before.get(a, 0)
    for a in net.honest:
        out.honest += state.vbonds.get(a, 0) - before[a] - cost[a]
    out.extra["units"] = TOTAL_UNITS
    return out


def _salt(cid: bytes, account: str) -> bytes:
    return digest("pot/bench/salt/v1", cid, account)


def _pair(role: str, run: Run, ch: P.ChallengeState) -> tuple[bytes, bytes]:
    cid = ch.challenge_id
    if role in ("honest", "sybil"):
        return run.true_pair(cid, ch.step)
    if role == "lazy":  # the value half copied from the opening, the proof half a guess
        return ch.opening["leaf_hash"], digest("pot/bench/guess/v1", cid)
    if role == "colluder":
        return run.miner_pair(cid, ch.step)
    # noisy, griefer, withholder: one wrong pair the group shares
    return digest("pot/bench/wrong/v1", cid), digest("pot/bench/wrong-proof/v1", cid)


def _actions(state: P.ProtocolState, run: Run, role: dict[str, str], n: int, cost: Counter,
             replay_cost_units: float, cost_per: str) -> list[tuple[str, Any]]:
    """The calls the actors put in block n, from what the chain shows after block n - 1."""
    calls: list[tuple[str, Any]] = []
    for ch in state.challenges.values():
        if ch.verdict is not None:
            continue
        cid = ch.challenge_id
        if ch.opening is None:
            if n <= ch.opening_deadline:
                calls.append((MINER, run.opening(cid, ch.step)))
            continue
        seats = Counter(ch.committee)
        if n <= ch.commit_deadline:
            for a in sorted(seats):
                if a in ch.commitments:
                    continue
                value, proof = _pair(role[a], run, ch)
                calls.append((a, CommitWitness(cid, witness_commitment(cid, value, 0, _salt(cid, a), a,
                                                                       proof_hash=proof))))
                if role[a] in REPLAYING:
                    cost[a] += replay_cost_units * (seats[a] if cost_per == "seat" else 1)
        elif n <= ch.reveal_deadline:
            for a in sorted(ch.commitments):
                if a in ch.reveals or role[a] == "withholder":
                    continue
                value, proof = _pair(role[a], run, ch)
                calls.append((a, RevealWitnessValue(cid, value, proof, 0, _salt(cid, a))))
        elif n <= ch.escalate_deadline and not ch.dispute:
            calls += _escalations(state, run, role, ch)
    return calls


def _escalations(state: P.ProtocolState, run: Run, role: dict[str, str], ch: P.ChallengeState) -> list:
    """Inside a round's escalation window. Honest accounts watch every round, seated or not: when
    the verdict its reveals give is wrong (the miner faked the step and it says honest, or the
    other way round), the first honest account with the escalation room escalates it, once.
    Griefers escalate every verdict that is right, each of them, while they have the room."""
    cid = ch.challenge_id
    result = P.round_result(state, cid)
    final = result.verdict in ("honest", "fraud") or (result.verdict == "refused" and ch.refused_rounds > 0)
    if not final:
        return []
    right = (result.verdict == "honest") == (ch.step not in run.faked)
    stake = state.params.escalation_stake
    calls = []
    if not right and not any(role[a] in ("honest", "sybil") for a in ch.escalations):
        for a in sorted(x for x in state.vbonds if role.get(x) in ("honest", "sybil")):
            if P.escalation_room(state, a) >= stake:
                calls.append((a, EscalateChallenge(cid)))
                break
        else:
            calls.append((next(a for a in sorted(state.vbonds) if role.get(a) in ("honest", "sybil")),
                          EscalateChallenge(cid)))  # refused for want of room: counted as starved
    if right:
        calls += [(a, EscalateChallenge(cid)) for a in sorted(state.vbonds)
                  if role.get(a) == "griefer" and a not in ch.escalations]
    return calls


def _largest_value(ch: P.ChallengeState, seats: Counter) -> bytes | None:
    """The value half of the largest seat-weighted cluster of the round's reveals (what a verifier
    reads off the chain to see whether it dissents); None on a tie."""
    clusters: Counter = Counter()
    for a, (value, _, proof) in ch.reveals.items():
        clusters[value + proof] += seats[a]
    ranked = clusters.most_common(2)
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0][:32]


# --- many draws ----------------------------------------------------------------------------------


def _stats(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("inf")
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def measure(sc: Scenario, draws: int, seed: int, params: P.ProtocolParams, replay_cost_units: float,
            cost_per: str, honest_miner_profit: float | None = None) -> dict[str, Any]:
    """Profit per challenge per unit of stake (x 10^4) of the scenario's group over `draws` runs."""
    net = build_network(sc, params.verifier_stake)
    rows = [play(sc, d, seed, params, replay_cost_units, cost_per) for d in range(draws)]
    per = [max(o.challenges, 1) for o in rows]
    if sc.strategy == "miner":
        stake = params.miner_stake + net.group_stake
        profit = [(o.miner + o.group) / c / stake * 1e4 for o, c in zip(rows, per, strict=True)]
        base = honest_miner_profit if honest_miner_profit is not None else 0.0
        gain = [(o.miner - base + o.group) / c / stake * 1e4 for o, c in zip(rows, per, strict=True)]
    else:
        stake = net.group_stake
        profit = [o.group / c / stake * 1e4 for o, c in zip(rows, per, strict=True)]
        gain = profit
    mean, se = _stats(profit)
    gmean, gse = _stats(gain)
    honest_mean, honest_se = _stats(
        [o.honest / c / o.honest_stake * 1e4 for o, c in zip(rows, per, strict=True)]
    )
    return {
        "strategy": row_name(sc.strategy, sc.fake),
        "share": share_label(sc.share),
        "share_of_stake": (net.group_stake if net.group else params.verifier_stake * ACCOUNT_UNITS)
        / (params.verifier_stake * TOTAL_UNITS),
        "accounts": len(net.group),
        "stake": stake,
        "draws": draws,
        "profit_bp": mean,
        "se_bp": se,
        "gain_bp": gmean,
        "gain_se_bp": gse,
        "honest_profit_bp": honest_mean,
        "honest_se_bp": honest_se,
        "miner_profit": sum(o.miner for o in rows) / draws,
        "stake_lost": sum(o.stake_lost for o in rows) / draws,
        "stake_released_in_full": sum(1 for o in rows if o.settled and o.stake_lost == 0) / draws,
        "fees": sum(o.fees for o in rows) / draws,
        "escrow_burned": sum(o.escrow_burned for o in rows) / draws,
        "slashed": sum(o.slashed for o in rows) / draws,
        "settled": sum(o.settled for o in rows) / draws,
        "rounds": sum(o.rounds for o in rows) / draws,
        "disputes": sum(o.disputes for o in rows) / draws,
        "escalations": sum(o.escalations for o in rows) / draws,
        "escalations_refused_no_free_bond": sum(o.starved for o in rows) / draws,
        "unresolved": sum(o.unresolved for o in rows) / draws,
        "group_paid": sum(o.group_paid for o in rows) / draws,
    }


def scenarios() -> list[Scenario]:
    out = [Scenario(s, share) for s in VERIFIER_STRATEGIES for share in SHARES]
    out += [Scenario("miner", share, fake) for fake in MINER_FAKES for share in SHARES]
    return out


def run_all(draws: int, seed: int, params: P.ProtocolParams, replay_cost_units: float, cost_per: str,
            progress: bool = False) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    honest_miner = None
    t0 = time.time()
    for sc in scenarios():
        r = measure(sc, draws, seed, params, replay_cost_units, cost_per, honest_miner)
        if sc.strategy == "miner" and sc.fake == 0 and sc.share is None:
            honest_miner = r["miner_profit"]
            r = measure(
                sc, draws, seed, params, replay_cost_units, cost_per, honest_miner
            )  # its gain: 0 by construction
        results.setdefault(r["strategy"], {})[r["share"]] = r
        if progress:
            print(f"  {sc.key}: {r['profit_bp']:+.3f} +- {r['se_bp']:.3f} bp ({time.time() - t0:.0f} s)",
                  file=sys.stderr)
    return {"draws": draws, "seed": seed, "replay_cost_units": replay_cost_units, "cost_per": cost_per,
            "network": {"units": TOTAL_UNITS, "account_units": ACCOUNT_UNITS, "sybil_split": SYBIL_SPLIT,
                        "run_steps": RUN_STEPS},
            "params": params.to_dict(), "results": results, "verdicts": verdicts(results, params),
            "seconds": round(time.time() - t0, 1)}


# --- verdicts ------------------------------------------------------------------------------------


def _negative(r: dict[str, Any], key: str = "gain") -> bool:
    return r[f"{key}_bp"] + 2 * r[f"{key}_se_bp"] < 0


def verdicts(results: dict[str, dict[str, Any]], params: P.ProtocolParams) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    honest = results["honest"]["alone"]
    ok = honest["profit_bp"] - 2 * honest["se_bp"] > 0
    out.append(
        {
            "rule": "honest verification has positive expected profit at the default parameters",
            "ok": ok,
            "text": f"honest verifier alone: {honest['profit_bp']:+.3f} ± {honest['se_bp']:.3f} bp of its "
                    "stake "
            f"per challenge ({'positive' if ok else 'NOT positive'} by two standard errors)",
        }
    )
    labels = [share_label(s) for s in SHARES]
    for strategy, rows in results.items():
        if strategy == "honest":
            continue
        if strategy == "sybil":
            diffs = {lab: (rows[lab]["profit_bp"] - results["honest"][lab]["profit_bp"],
                           math.hypot(rows[lab]["se_bp"], results["honest"][lab]["se_bp"])) for lab in labels}
            first = next((lab for lab in labels if diffs[lab][0] - 2 * diffs[lab][1] > 0), None)
            shown = ", ".join(f"{lab} {d:+.3f} ± {e:.3f}" for lab, (d, e) in diffs.items())
            out.append(
                {
                    "rule": "sybil: splitting a stake gains nothing over honest play",
                    "ok": first is None,
                    "first_not_negative": first,
                    "text": f"sybil, gain over honest play (bp): {shown}; "
                    + (
                        "no share gains by more than two standard errors"
                        if first is None
                        else f"GAINS at {first}"
                    ),
                }
            )
            continue
        # The honest miner alone is the miners' baseline (its gain is 0 by construction): its row
        # measures colluders that take the honest miner's own pair instead of replaying.
        measured = labels[1:] if strategy == "miner fakes 0" else labels
        name = (
            "colluders of an honest miner (its pair, no replay)" if strategy == "miner fakes 0" else strategy
        )
        first = next((lab for lab in measured if not _negative(rows[lab])), None)
        what = "gain over honest operation" if strategy.startswith("miner") else "profit"
        if first is None:
            text = f"{name}: negative at every measured share (up to s={SHARES[-1]:g})"
        else:
            at = f"{rows[first]['gain_bp']:+.3f} ± {rows[first]['gain_se_bp']:.3f} bp"
            text = (
                f"{name}: NOT negative even at the smallest share, {first} ({what} {at})"
                if first == measured[0]
                else f"{name}: negative for coalitions below {first} (at {first} its {what} is {at})"
            )
        out.append(
            {
                "rule": f"{name}: negative expected profit below a stake share",
                "ok": first != measured[0],
                "first_not_negative": first,
                "text": text,
            }
        )
    miner = results["miner fakes 0"]
    full = all(r["stake_released_in_full"] == 1 for r in miner.values())
    lost = max(r["stake_lost"] for r in miner.values())
    out.append(
        {
            "rule": "an honest miner's expected loss is zero (its stake is released in full: RunSettled)",
            "ok": full,
            "text": f"honest miner, honest or colluding verifiers: stake released in full in "
            f"{'every' if full else 'NOT every'} draw at every share (largest mean loss {lost:g}); it pays "
            f"{miner['alone']['fees']:g} units of seat fees a run from its escrow",
        }
    )
    for strategy in VERIFIER_STRATEGIES:
        rows = results[strategy]
        hit = [lab for lab in labels if rows[lab]["stake_released_in_full"] < 1]
        if not hit:
            continue
        first = hit[0]
        r = rows[first]
        out.append(
            {
                "rule": f"an honest miner's expected loss is zero against {strategy} verifiers",
                "ok": False,
                "first_not_zero": first,
                "text": f"honest miner against {strategy} verifiers: stake NOT released in full from {first} "
                f"(there slashed in {r['slashed']:.0%} of runs, {r['unresolved']:.2f} challenges a run "
                f"unresolved, mean stake lost {r['stake_lost']:.1f} of {params.miner_stake}; "
                f"{r['escalations_refused_no_free_bond']:.2f} escalations a run refused for want of "
                f"free bond)",
            }
        )
    return out


# --- output --------------------------------------------------------------------------------------


def table(res: dict[str, Any], value: str = "profit", rows: tuple[str, ...] | None = None) -> str:
    """A strategy x share matrix of `value`_bp ± its standard error (`honest_profit`: the honest
    accounts'), or of a plain mean (`slashed`, `stake_lost`, ...)."""
    labels = [share_label(s) for s in SHARES]
    lines = ["| strategy | " + " | ".join(labels) + " |", "|---|" + "|".join("---:" for _ in labels) + "|"]
    for strategy, cells in res["results"].items():
        if rows is not None and strategy not in rows:
            continue
        if value in ("profit", "honest_profit"):
            se = "se" if value == "profit" else "honest_se"
            shown = [f"{cells[lab][value + '_bp']:+.2f} ± {cells[lab][se + '_bp']:.2f}" for lab in labels]
        else:
            shown = [f"{cells[lab][value]:.2f}" for lab in labels]
        lines.append(f"| {strategy} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def miner_table(res: dict[str, Any]) -> str:
    lines = ["| miner | share | P(slashed) | stake lost | fees paid | escrow burned | disputes | "
             "loss beyond honest (bp) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for strategy, rows in res["results"].items():
        if not strategy.startswith("miner"):
            continue
        for lab, r in rows.items():
            lines.append(
                f"| {strategy} | {lab} | {r['slashed']:.2f} | {r['stake_lost']:.1f} | {r['fees']:.1f} | "
                f"{r['escrow_burned']:.1f} | {r['disputes']:.2f} | {-r['gain_bp']:+.2f} ± "
                f"{r['gain_se_bp']:.2f} |"
            )
    return "\n".join(lines)


def report(res: dict[str, Any]) -> str:
    """The markdown the bench prints (and docs/protocol.md keeps)."""
    p = P.ProtocolParams.from_dict(res["params"])
    out = [
        f"{res['draws']} runs per cell, seed {res['seed']}, default parameters: seat fee {res['seat_fee']} "
        "units, "
        f"replay cost {res['replay_cost_units']:g} a {res['cost_per']}, penalties {p.no_show_penalty} (no "
        "show) and "
        f"{p.outlier_penalty} (outlier) a seat, escalation stake {p.escalation_stake}, slash "
        f"{p.slash_amount} of "
        f"a miner stake of {p.miner_stake}. The network: {TOTAL_UNITS} seat units of {p.verifier_stake}; "
        f"{shares_line(res)}.",
        "",
        "Profit of the group per challenge per unit of its stake, x 10^4 (mean ± standard error; miner rows: "
        "miner and colluding coalition together):",
        "",
        table(res),
        "",
        "The honest verifiers' profit beside each verifier deviation (x 10^4 of their stake per challenge):",
        "",
        table(res, "honest_profit", VERIFIER_STRATEGIES),
        "",
        "Share of runs in which the (honest) miner was slashed, beside each verifier deviation:",
        "",
        table(res, "slashed", VERIFIER_STRATEGIES),
        "",
        "Miners (loss beyond honest: what faking costs per challenge, x 10^4 of the group's stake; "
        "stake, fees and escrow in units a run):",
        "",
        miner_table(res),
        "",
        *(f"- [{'ok' if v['ok'] else 'FAILS'}] {v['text']}" for v in res["verdicts"]),
    ]
    return "\n".join(out)


def shares_line(res: dict[str, Any]) -> str:
    r = res["results"]["honest"]
    return ", ".join(f"{lab} = {v['share_of_stake']:.3f} of the stake in {v['accounts']} account(s)"
                     for lab, v in r.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--draws", type=int, default=300, help="runs per strategy and share (different block hashes)"
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of the block hashes and the faked steps")
    ap.add_argument("--replay-cost-units", type=float, default=None,
                    help="a replay's cost in protocol units (default: half the run's seat fee)")
    ap.add_argument(
        "--cost-per",
        choices=("seat", "account"),
        default="seat",
        help="charge the replay cost per seat held (default) or once per round an account sits on",
    )
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    ap.add_argument("--progress", action="store_true", help="one line per scenario on stderr")
    a = ap.parse_args(argv)
    if a.draws < 2:
        ap.error("--draws must be at least 2 (a standard error needs two draws)")
    params = P.ProtocolParams()
    seat_fee = _seat_fee(params)
    cost = a.replay_cost_units if a.replay_cost_units is not None else seat_fee / 2
    if cost < 0:
        ap.error("--replay-cost-units must be at least 0")
    res = run_all(a.draws, a.seed, params, cost, a.cost_per, a.progress)
    res["seat_fee"] = seat_fee
    if a.json:
        print(json.dumps(res, default=str))
        return 0
    print("Incentives on the real state machine (bench/incentives.py)")
    print()
    print(report(res))
    print()
    print(f"({res['seconds']} s)")
    return 0


def _seat_fee(params: P.ProtocolParams) -> int:
    """The seat fee of this bench's run under `params` (chain.protocol.cost.run_escrow)."""
    fee, _ = run_escrow(replay_cost(Run("fee", set()).spec, params).blocks, params)
    return fee


if __name__ == "__main__":
    sys.exit(main())
