"""The protocol's rules: `on_block` (issue due challenges, resolve closed ones) and `apply` (one
call), deterministic, the same code behind every transport. Every check runs before any change, so
a refused call leaves the state as it was."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields as dataclass_fields
from typing import Any

from chain.calls import (
    BondVerifier,
    Call,
    CommitWitness,
    ConfigureNetwork,
    DeclareWitnessNormBucket,
    EscalateChallenge,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    UnbondVerifier,
    derive_run_id,
)
from chain.protocol.cost import opening_blocks, replay_cost, run_escrow
from chain.protocol.events import (
    BlockWorkFailed,
    BondReleased,
    Burned,
    CallRefused,
    ChallengeEscalated,
    ChallengeIssued,
    ChallengeResolved,
    CheckpointRootUpdated,
    EscalationSettled,
    Event,
    MinerSlashed,
    NetworkConfigured,
    NormBucketDeclared,
    OpeningSubmitted,
    ParamsEffective,
    RevealRejected,
    RunRegistered,
    RunSettled,
    VerifierBonded,
    VerifierOutlier,
    VerifierPaid,
    VerifierPenalized,
    VerifierUnbonding,
    WitnessCommitted,
    WitnessRevealed,
)
from chain.protocol.params import (
    INT63,
    MAX_BLOCK,
    MAX_BOND,
    MAX_COMMITTEE,
    MAX_DECLARED_STEPS,
    MAX_DISPUTE_SEATS,
    MAX_ENDPOINT_BYTES,
    MAX_LEAF_BYTES,
    MAX_OPEN_RUNS_PER_MINER,
    MAX_REASON_CHARS,
    MAX_SCHEDULED_CHANGES,
    MAX_SPEC_BYTES,
    MAX_UNBONDING_PER_VERIFIER,
    MAX_URI_BYTES,
    MAX_VERIFIERS,
    ParamRangeError,
    ProtocolParams,
)
from chain.protocol.refusals import (
    AlreadyCommitted,
    AlreadyDeclared,
    AlreadyOpened,
    AmountOverBond,
    BadConsistencyProof,
    BadLeaf,
    BadLeafProof,
    BadRootSize,
    BondBelowMinimum,
    BondReserved,
    ChallengeClosed,
    CheckpointIntervalTooLong,
    CommitmentMismatch,
    CommitWindowClosed,
    DeclarationTooLate,
    EscrowTooLarge,
    FieldTooLarge,
    InsufficientFreeBond,
    InvalidCall,
    NoCommitment,
    NoOpening,
    NotAuthority,
    NotBonded,
    NotCrossArchitecture,
    NotEscalable,
    NotInCommittee,
    NotRunOwner,
    OpeningTooLate,
    OwnChallenge,
    ParamOutOfRange,
    Refused,
    ReplayTooSlow,
    RetroactiveChange,
    RevealTooEarly,
    RevealTooLate,
    RootNotAppendOnly,
    RunExists,
    RunIdNotOwned,
    TooMany,
    UnknownCall,
    UnknownChallenge,
    UnknownRun,
)
from chain.protocol.state import (
    ChallengeState,
    ProtocolState,
    RunState,
    dispute_bonds,
    eligible_verifiers,
    escalation_room,
    free_bond,
    registration_digest,
)
from challenges.derive import challenge_id as derive_challenge_id
from challenges.derive import challenge_step_at, dispute_seats, draw_committee, rechallenge_id, seat_units
from challenges.refused import REFUSED_BUCKET, refused_value_hash
from challenges.verdict import FRAUD, HONEST, INCONCLUSIVE, REFUSED, Reveal, VerdictResult, decide
from challenges.witness import verify_witness
from commitments import cbor
from commitments.canonical import describe_refusal, first_difference
from commitments.errors import CommitmentError
from commitments.leaves import parse_step_leaf, witness_value_hash
from commitments.merkle import verify_consistency, verify_inclusion
from commitments.spec import Spec


def _number(block: Any) -> int:
    return block if isinstance(block, int) else block.number


def apply(state: ProtocolState, call: Call, origin: str, block: Any) -> list[Event]:
    """Apply one call by `origin` included in `block` (a Block or its number).

    Every check runs before any change, so a refused call leaves the state untouched — except
    `CommitmentMismatch`, whose rejection is recorded in the challenge (the refusal carries the
    `RevealRejected` event).
    """
    n = _number(block)
    handler = _HANDLERS.get(type(call))
    if handler is None:
        raise UnknownCall(f"{type(call).__name__} is not a protocol call")
    return handler(state, call, origin, n)


def apply_recorded(state: ProtocolState, call: Call, origin: str, block: Any) -> list[Event]:
    """`apply`, with a refusal turned into events (what a chain follower records; never raises)."""
    try:
        return apply(state, call, origin, block)
    except Refused as exc:
        name = getattr(call, "NAME", type(call).__name__)
        reason = (
            exc.reason if len(exc.reason) <= MAX_REASON_CHARS else exc.reason[: MAX_REASON_CHARS - 3] + "..."
        )
        return [*exc.events, CallRefused(_number(block), origin, name, exc.code, reason)]


def _cap(name: str, size: int, limit: int) -> None:
    if size > limit:
        raise FieldTooLarge(f"{name} is {size} bytes; the protocol keeps at most {limit}")


def _open_runs(state: ProtocolState, miner: str) -> int:
    return sum(
        1
        for r in state.runs.values()
        if r.miner == miner
        and (not r.challenges or any(state.challenges[c].verdict is None for c in r.challenges))
    )


def _start(state: ProtocolState, c: StartTrainingCommitment, origin: str, n: int) -> list[Event]:
    registration = registration_digest(cbor.encode(c.to_wire()))
    existing = state.runs.get(c.run_id)
    if existing is not None:
        if existing.miner == origin and existing.registration == registration:
            return []
        how = f"by {existing.miner!r}" if existing.miner != origin else "with different commitments"
        raise RunExists(f"run {c.run_id.hex()[:16]} is already registered {how}")
    if derive_run_id(origin, c.nonce) != c.run_id:
        raise RunIdNotOwned(f"run id {c.run_id.hex()[:16]} is not derive_run_id({origin!r}, nonce): a run id "
                            f"belongs to the account that derived it")
    _cap("the spec", len(c.spec), MAX_SPEC_BYTES)
    _cap("the endpoint", len(c.endpoint.encode("utf-8")), MAX_ENDPOINT_BYTES)
    if c.declared_steps > MAX_DECLARED_STEPS:
        raise FieldTooLarge(f"declared_steps is over the protocol's limit of {MAX_DECLARED_STEPS}")
    if _open_runs(state, origin) >= MAX_OPEN_RUNS_PER_MINER:
        raise TooMany(f"{origin!r} has {MAX_OPEN_RUNS_PER_MINER} runs whose challenges are not all resolved")
    try:
        spec = Spec.from_cbor(c.spec)
    except CommitmentError as exc:
        why = describe_refusal(c.spec, exc) if isinstance(getattr(exc, "offset", None), int) else str(exc)
        raise InvalidCall(f"run {c.run_id.hex()[:16]}: the spec is not usable: {why}") from None
    canonical = spec.to_cbor()
    if c.spec != canonical:
        raise InvalidCall(
            f"the spec is not in its canonical CBOR form: {first_difference(c.spec, canonical)}"
        )
    if c.declared_steps != spec.steps:
        raise InvalidCall(f"declared_steps ({c.declared_steps}) differs from the spec's steps ({spec.steps})")
    mode = "value" if spec.profile == "exact-v1" else "bucket"
    cost = replay_cost(spec, state.params)
    if cost.blocks > state.params.max_replay_blocks:
        raise ReplayTooSlow(
            f"one step's replay needs about {float(cost.seconds):.0f} s at the reference speed "
            f"({cost.flops:.3g} FLOPs, "
            f"{cost.bytes:.3g} bytes), {cost.blocks} blocks with the margin; the protocol allows "
            f"{state.params.max_replay_blocks}"
        )
    window = opening_blocks(spec, state.params, c.checkpoint_interval)
    if window > state.params.max_replay_blocks:
        fits = max(1, c.checkpoint_interval * state.params.max_replay_blocks // window)
        raise CheckpointIntervalTooLong(
            f"regenerating a step from a state kept every {c.checkpoint_interval} steps needs an opening "
            "window of "
            f"{window} blocks at the reference speed; the protocol allows {state.params.max_replay_blocks}: "
            "keep a "
            f"state at least every {fits} steps"
        )
    seat_fee, escrow = run_escrow(cost.blocks, state.params)
    if escrow > MAX_BOND:
        raise EscrowTooLarge(
            f"the run's verification escrow would be {escrow} units; one amount is at most {MAX_BOND}"
        )
    stake = state.params.miner_stake
    state.runs[c.run_id] = RunState(
        run_id=c.run_id, miner=origin, registration=registration, spec_digest=spec.digest(), mode=mode,
        declared_steps=c.declared_steps, endpoint=c.endpoint, stake=stake, replay_blocks=cost.blocks,
        checkpoint_interval=c.checkpoint_interval, opening_blocks=window, seat_fee=seat_fee, escrow=escrow,
        escrow_left=escrow,
    )
    state.bonds[origin] = min(state.bonds.get(origin, 0) + stake, INT63)  # a running total, saturating
    return [RunRegistered(n, c.run_id, origin, spec.digest(), mode, c.declared_steps, c.endpoint,
                          c.initial_hash, c.schedule_commitment, c.dataset_hash, stake, escrow,
                          c.checkpoint_interval, window)]


def _run_of(state: ProtocolState, run_id: bytes, origin: str) -> RunState:
    run = state.runs.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id.hex()[:16]} is registered")
    if run.miner != origin:
        raise NotRunOwner(f"run {run_id.hex()[:16]} belongs to {run.miner!r}, not {origin!r}")
    return run


def _root(state: ProtocolState, c: SubmitCheckpointRoot, origin: str, n: int) -> list[Event]:
    run = _run_of(state, c.run_id, origin)
    full = run.declared_steps + 1  # leaves 0..T
    if not 1 <= c.size <= full:
        raise BadRootSize(f"root size {c.size} is outside 1..{full} (leaves 0..{run.declared_steps})")
    if run.root is None:
        if c.consistency_proof:
            raise BadConsistencyProof(
                "the first root of a run extends the empty tree: its proof must be empty"
            )
    elif c.size < run.size:
        raise RootNotAppendOnly(f"root size {c.size} is smaller than the current size {run.size}")
    elif c.size == run.size:
        if c.root == run.root:
            return []
        raise RootNotAppendOnly(f"a different root for the same size {c.size} rewrites the history")
    elif not verify_consistency(run.size, c.size, run.root, c.root, list(c.consistency_proof)):
        raise BadConsistencyProof(
            f"the proof does not show the tree of size {run.size} is a prefix of the new tree of size "
            f"{c.size}"
        )
    run.root, run.size = c.root, c.size
    complete = c.size == full
    if complete:
        run.challenges_at = n + state.params.challenge_delay
    return [CheckpointRootUpdated(n, c.run_id, c.root, c.size, complete, run.challenges_at)]


def _challenge(state: ProtocolState, challenge_id: bytes) -> ChallengeState:
    ch = state.challenges.get(challenge_id)
    if ch is None:
        raise UnknownChallenge(f"no challenge {challenge_id.hex()[:16]}")
    return ch


def _open_challenge(state: ProtocolState, challenge_id: bytes) -> ChallengeState:
    ch = _challenge(state, challenge_id)
    if ch.verdict is not None:
        raise ChallengeClosed(f"challenge {challenge_id.hex()[:16]} is already resolved ({ch.verdict})")
    return ch


def _opening(state: ProtocolState, c: SubmitOpening, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    run = _run_of(state, ch.run_id, origin)
    if n > ch.opening_deadline:
        raise OpeningTooLate(f"the opening was due by block {ch.opening_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    fields_ = {"opening_digest": c.opening_digest, "uri": c.uri, "mirrors": list(c.mirrors), "leaf": c.leaf}
    if ch.opening is not None:
        if all(ch.opening[k] == v for k, v in fields_.items()):
            return []
        raise AlreadyOpened(f"challenge {c.challenge_id.hex()[:16]} already has an opening")
    for uri in (c.uri, *c.mirrors):
        _cap("an opening URI", len(uri.encode("utf-8")), MAX_URI_BYTES)
    _cap("the leaf", len(c.leaf), MAX_LEAF_BYTES)
    if not verify_inclusion(c.leaf, ch.step, ch.size, list(c.leaf_proof), ch.root):
        raise BadLeafProof(f"the leaf proof does not show the leaf at index {ch.step} of the challenged root")
    try:
        leaf = parse_step_leaf(c.leaf)
    except CommitmentError as exc:
        raise BadLeaf(f"leaf {ch.step} is not a step leaf: {exc}") from None
    if leaf.t != ch.step:
        raise BadLeaf(f"the leaf says step {leaf.t}, the challenge is step {ch.step}")
    leaf_hash = witness_value_hash(c.leaf)
    ch.opening = {**fields_, "leaf_hash": leaf_hash, "block": n}
    return [
        OpeningSubmitted(
            n,
            ch.challenge_id,
            run.run_id,
            ch.step,
            c.opening_digest,
            c.uri,
            c.leaf,
            leaf_hash,
            tuple(c.mirrors),
        )
    ]


def _declare(state: ProtocolState, c: DeclareWitnessNormBucket, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    _run_of(state, ch.run_id, origin)
    if ch.mode != "bucket":
        raise NotCrossArchitecture(
            "the run's spec is exact: its verdict compares value hashes, not norm buckets"
        )
    if n > ch.commit_deadline:
        raise DeclarationTooLate(f"the norm bucket was due by block {ch.commit_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    if ch.declared_bucket is not None:
        if ch.declared_bucket == c.bucket:
            return []
        raise AlreadyDeclared(f"bucket {ch.declared_bucket} is already declared for this challenge")
    ch.declared_bucket = c.bucket
    return [NormBucketDeclared(n, c.challenge_id, c.bucket)]


def _commit(state: ProtocolState, c: CommitWitness, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    if state.runs[ch.run_id].miner == origin:
        raise OwnChallenge("the run's miner cannot witness its own challenge")
    if n > ch.commit_deadline:
        raise CommitWindowClosed(f"the commit window closed at block {ch.commit_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    prior = ch.commitments.get(origin)
    if prior is not None:
        if prior == c.commitment:
            return []
        raise AlreadyCommitted(f"{origin!r} has already committed to this challenge")
    if origin not in ch.held:
        raise NotInCommittee(
            f"{origin!r} does not sit on the committee of challenge {c.challenge_id.hex()[:16]} "
            f"(round {ch.round}, {len(ch.committee)} seats)"
        )
    if ch.opening is None:
        raise NoOpening(
            f"challenge {c.challenge_id.hex()[:16]} has no opening on chain yet: there is nothing to "
            f"replay (commit after the opening, by block {ch.commit_deadline})"
        )
    # No cap: only seated accounts commit, once each, and a round seats at most
    # MAX_WITNESSES_PER_CHALLENGE accounts, so arrival order never decides who takes part.
    ch.commitments[origin] = c.commitment
    return [WitnessCommitted(n, c.challenge_id, origin, c.commitment)]


def _reveal(state: ProtocolState, c: RevealWitnessValue, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    commitment = ch.commitments.get(origin)
    if commitment is None:
        raise NoCommitment(f"{origin!r} has no commitment to reveal for this challenge")
    if n <= ch.commit_deadline:
        raise RevealTooEarly(f"reveals open after the commit window closes at block {ch.commit_deadline}")
    if n > ch.reveal_deadline:
        raise RevealTooLate(f"the reveal window closed at block {ch.reveal_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    if not verify_witness(commitment, c.challenge_id, c.value_hash, c.norm_bucket, c.salt, origin,
                          proof_hash=c.proof_hash):
        reason = "the revealed value, proof, bucket and salt do not open the commitment"
        if all(r[1] != origin for r in ch.rejected):  # one record per verifier keeps the list bounded
            ch.rejected.append([n, origin, reason])
        raise CommitmentMismatch(reason, [RevealRejected(n, c.challenge_id, origin, reason)])
    if origin in ch.reveals:
        return []
    ch.reveals[origin] = [c.value_hash, c.norm_bucket, c.proof_hash]
    return [WitnessRevealed(n, c.challenge_id, origin, c.value_hash, c.norm_bucket, c.proof_hash)]


def _bond(state: ProtocolState, c: BondVerifier, origin: str, n: int) -> list[Event]:
    held = state.vbonds.get(origin, 0) + sum(x[1] for x in state.unbonding.get(origin, []))
    if held + c.amount > MAX_BOND:
        raise FieldTooLarge(
            f"{origin!r} would hold a bond of {held + c.amount}; the protocol keeps at most {MAX_BOND}"
        )
    active = state.vbonds.get(origin, 0)
    if active + c.amount < state.params.verifier_stake:
        raise BondBelowMinimum(
            f"{origin!r} would hold an active bond of {active + c.amount}; a verifier bonds at "
            f"least verifier_stake ({state.params.verifier_stake}), one seat's collateral"
        )
    if origin not in state.verifiers and len(state.verifiers) >= MAX_VERIFIERS:
        raise TooMany(f"{MAX_VERIFIERS} accounts hold verifier bonds already (each at least verifier_stake)")
    if origin not in state.verifiers:
        state.verifiers.append(origin)
    state.vbonds[origin] = active + c.amount
    state.bonds[origin] = min(state.bonds.get(origin, 0) + c.amount, INT63)  # a running total, saturating
    return [VerifierBonded(n, origin, c.amount, state.vbonds[origin])]


def _unbond(state: ProtocolState, c: UnbondVerifier, origin: str, n: int) -> list[Event]:
    active = state.vbonds.get(origin, 0)
    if active == 0:
        raise NotBonded(f"{origin!r} has no active bond; it cannot unbond {c.amount}")
    if c.amount > active:
        raise AmountOverBond(f"{origin!r} has an active bond of {active}; it cannot unbond {c.amount}")
    free = free_bond(state, origin)
    if c.amount > free:
        raise BondReserved(
            f"{origin!r} has {free} of its bond of {active} free; the rest backs seats of open "
            f"rounds until they are settled"
        )
    left = active - c.amount
    if 0 < left < state.params.verifier_stake:
        raise BondBelowMinimum(
            f"unbonding {c.amount} would leave {left}, below verifier_stake "
            f"({state.params.verifier_stake}): unbond all of it, or at most "
            f"{active - state.params.verifier_stake}"
        )
    waiting = state.unbonding.setdefault(origin, [])
    if len(waiting) >= MAX_UNBONDING_PER_VERIFIER:
        raise TooMany(f"{origin!r} has {MAX_UNBONDING_PER_VERIFIER} unbonding amounts waiting already")
    release = n + state.params.unbonding_delay
    state.vbonds[origin] = left
    waiting.append([release, c.amount])
    return [VerifierUnbonding(n, origin, c.amount, release, state.vbonds[origin])]


def _release_due(state: ProtocolState, n: int, events: list[Event]) -> None:
    """Release unbonding amounts whose block has come. An unbonded amount was free bond, backing no
    seat, so nothing it could owe is left. Each account's release is contained (`_contained`)."""
    if not any(x[0] <= n for waiting in state.unbonding.values() for x in waiting):
        return
    for account in sorted(state.unbonding):
        _contained(state, events, n, "release", account, lambda a=account: _release_account(state, a, n))


def _release_account(state: ProtocolState, account: str, n: int) -> list[Event]:
    waiting = state.unbonding[account]
    due = [x for x in waiting if x[0] <= n]
    events: list[Event] = []
    if due:
        state.unbonding[account] = [x for x in waiting if x[0] > n]
        events += [BondReleased(n, account, amount) for _, amount in due if amount > 0]
    if not state.unbonding[account]:
        del state.unbonding[account]
    _leave_if_empty(state, account)
    return events


def _leave_if_empty(state: ProtocolState, account: str) -> None:
    """An account holding no bond (active, unbonding or reserved) leaves the verifier registry, so
    the registry's cap counts accounts that hold stake."""
    if (
        state.vbonds.get(account, 0) == 0
        and not state.unbonding.get(account)
        and not state.reserved.get(account)
    ):
        state.vbonds.pop(account, None)
        state.reserved.pop(account, None)
        state.unbonding.pop(account, None)
        if account in state.verifiers:
            state.verifiers.remove(account)


def _reserve(state: ProtocolState, account: str, amount: int) -> None:
    state.reserved[account] = state.reserved.get(account, 0) + amount


def _unreserve(state: ProtocolState, account: str, amount: int) -> None:
    left = state.reserved.get(account, 0) - amount
    if left:
        state.reserved[account] = left
    else:
        state.reserved.pop(account, None)


def _penalize(state: ProtocolState, ch: ChallengeState, account: str, amount: int, why: str, n: int,
              *, burn: bool = True) -> list[Event]:
    """Take `amount` from what the account's seats hold on this round: always paid in full (a
    round's seat holds verifier_stake, and a unit of bond backs at most one seat of a round below
    the dispute round and one dispute seat, each paying at most one penalty of at most half a
    unit; params). Burned, unless the caller pays it on (`burn=False`: a dispute round's pool)."""
    take = min(amount, ch.held.get(account, 0), state.vbonds.get(account, 0))
    if take <= 0:
        return []
    ch.held[account] -= take
    if not ch.dispute:
        _unreserve(state, account, take)
    state.vbonds[account] -= take
    state.slashed[account] = min(state.slashed.get(account, 0) + take, INT63)  # a running total, saturating
    if burn:
        state.burned = min(state.burned + take, INT63)
    return [VerifierPenalized(n, ch.challenge_id, account, take, why)]


def _free_seats(state: ProtocolState, ch: ChallengeState) -> None:
    """Settle a round's holds: what its seats still hold is free again (a dispute round's seats
    hold outside `reserved`)."""
    for account in sorted(ch.held):
        if not ch.dispute:
            _unreserve(state, account, ch.held[account])
        ch.held[account] = 0
        _leave_if_empty(state, account)
    ch.pending = False


def _credit(state: ProtocolState, subject: bytes, account: str, amount: int, why: str, n: int) -> list[Event]:
    """Credit `amount` to a verifier's active bond (past the bond cap the excess is burned)."""
    if amount <= 0:
        return []
    room = MAX_BOND - state.vbonds.get(account, 0) - sum(x[1] for x in state.unbonding.get(account, []))
    give = max(0, min(amount, room))
    events: list[Event] = []
    if give:
        state.vbonds[account] = state.vbonds.get(account, 0) + give
        state.paid[account] = min(state.paid.get(account, 0) + give, INT63)
        events.append(VerifierPaid(n, subject, account, give, why))
    if amount > give:
        events += _burn(state, subject, amount - give, "over the bond cap", n)
    return events


def _burn(state: ProtocolState, subject: bytes, amount: int, why: str, n: int) -> list[Event]:
    if amount <= 0:
        return []
    state.burned = min(state.burned + amount, INT63)
    return [Burned(n, subject, amount, why)]


def _pay_seats(
    state: ProtocolState,
    ch: ChallengeState,
    run: RunState,
    winners: Counter,
    pools: list[tuple[str, int]],
    n: int,
) -> list[Event]:
    """Pay a resolved round's winning seats: `run.seat_fee` a seat from the run's escrow while it
    lasts, and each further pool (why, amount) shared equally per seat; what an equal share of a
    pool leaves over is burned. No winning seat: the pools are burned."""
    seats = sum(winners.values())
    events: list[Event] = []
    # The escrow pays every winning seat the same: the seat fee, or less when the escrow runs
    # short (a dispute round's many seats); what does not divide stays in the escrow.
    fee = min(run.seat_fee, run.escrow_left // seats) * seats if seats else 0
    run.escrow_left -= fee
    for why, amount in [("seat_fee", fee), *pools]:
        if amount <= 0:
            continue
        if seats == 0:
            events += _burn(state, ch.challenge_id, amount, f"{why}: no winning seat", n)
            continue
        share = amount // seats
        for v in sorted(winners):
            events += _credit(state, ch.challenge_id, v, share * winners[v], why, n)
        events += _burn(
            state, ch.challenge_id, amount - share * seats, f"{why}: remainder of an equal share", n
        )
    return events


def _escalate(state: ProtocolState, c: EscalateChallenge, origin: str, n: int) -> list[Event]:
    """Any bonded account may dispute a round's verdict, seated or not (the run's miner
    included), by staking escalation_stake of its free bond on the dispute round ruling the
    other way."""
    ch = _challenge(state, c.challenge_id)
    if ch.dispute:
        raise NotEscalable("the dispute round is the last word: it cannot be escalated")
    if n <= ch.reveal_deadline:
        raise NotEscalable(f"escalations open after the reveal window closes at block {ch.reveal_deadline}")
    if n > ch.escalate_deadline:
        raise NotEscalable(f"the escalation window closed at block {ch.escalate_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    if origin in ch.escalations:
        return []
    result = _decide(state, ch)
    if not _final_value(ch, result):
        raise NotEscalable(f"the round has no verdict to dispute ({result.verdict}: {result.reason})")
    stake = state.params.escalation_stake
    room = escalation_room(state, origin)
    if stake > room:
        raise InsufficientFreeBond(
            f"escalating reserves escalation_stake ({stake}); {origin!r} has room for {max(room, 0)} beyond "
            "what its "
            f"seats and escalations may still be charged"
        )
    disputed = HONEST if result.verdict == HONEST else FRAUD
    _reserve(state, origin, stake)
    state.staked[origin] = state.staked.get(origin, 0) + stake
    ch.escalations[origin] = [disputed, stake]
    return [ChallengeEscalated(n, ch.challenge_id, origin, stake, disputed)]


def _configure(state: ProtocolState, c: ConfigureNetwork, origin: str, n: int) -> list[Event]:
    if state.authority is not None and origin != state.authority:
        raise NotAuthority(f"only the network's authority {state.authority!r} configures it, not {origin!r}")
    if c.effective_block <= n:
        raise RetroactiveChange(f"parameters take effect at a block after the record's (block {n}); "
                                f"effective_block is {c.effective_block}")
    if c.effective_block > MAX_BLOCK:
        raise ParamOutOfRange(f"effective_block must be a block in {n + 1}..2^62-1, got {c.effective_block}")
    try:
        params = ProtocolParams.from_cbor(c.params)
    except ParamRangeError as exc:  # a value no derived deadline, sum or column could hold (params.py)
        raise ParamOutOfRange(f"the parameters are out of range: {exc}") from None
    except ValueError as exc:
        raise InvalidCall(f"the parameters are not usable: {exc}") from None
    if len(state.schedule) >= MAX_SCHEDULED_CHANGES:
        raise TooMany(f"{MAX_SCHEDULED_CHANGES} parameter changes are waiting for their block already")
    state.authority = origin
    state.schedule.append([c.effective_block, n, params.to_dict()])
    state.schedule.sort(key=lambda x: (x[0], x[1]))  # stable: records of one block keep their order
    return [NetworkConfigured(n, origin, params.digest(), params.to_dict(), c.effective_block)]


def activate_due(state: ProtocolState, n: int) -> list[Event]:
    """Scheduled parameters whose block has come take effect (the last record wins a block)."""
    events: list[Event] = []
    while state.schedule and state.schedule[0][0] <= n:
        events.append(_activate_next(state, n))
    return events


def _activate_next(state: ProtocolState, n: int) -> Event:
    _, configured_at, d = state.schedule.pop(0)
    state.params = ProtocolParams.from_dict(d)
    state.configured_at = configured_at
    return ParamsEffective(n, state.params.digest(), configured_at)


# Each handler takes its own call type; the look-up by type(call) is what pairs them.
_HANDLERS: dict[type, Callable[[ProtocolState, Any, str, int], list[Event]]] = {
    StartTrainingCommitment: _start,
    SubmitCheckpointRoot: _root,
    SubmitOpening: _opening,
    DeclareWitnessNormBucket: _declare,
    CommitWitness: _commit,
    RevealWitnessValue: _reveal,
    ConfigureNetwork: _configure,
    BondVerifier: _bond,
    UnbondVerifier: _unbond,
    EscalateChallenge: _escalate,
}


def on_block(state: ProtocolState, block: Any) -> list[Event]:
    """Protocol work due at a new finalized block, before its calls: parameters and bond releases
    that are due, the challenge drawn from this block's hash for every run whose turn it is, then
    the challenges whose windows have closed.

    Never raises past the head check. Each item of that work (one parameter record, one account's
    release, one run's issuance, one challenge's resolution) runs contained: one that fails inside
    the protocol is undone (`_Savepoint`) and recorded as a `BlockWorkFailed` event, and the others
    go on. A failed record is dropped (it would fail the same way at every block); a failed
    release, issuance or resolution stays due and is tried again at the next block."""
    n, block_hash = block.number, block.hash
    if n <= state.head:
        raise ValueError(f"block {n} is not after the last processed block {state.head}")
    state.head = n
    events: list[Event] = []
    with _stage(events, n, "activation"):
        while state.schedule and state.schedule[0][0] <= n:
            if not _contained(state, events, n, "activation", "", lambda: [_activate_next(state, n)]):
                del state.schedule[0]
    with _stage(events, n, "release"):
        _release_due(state, n, events)
    with _stage(events, n, "issuance"):
        p = state.params
        if state.disputes:
            parent = state.challenges.get(state.disputes[0][0])
            _contained(state, events, n, "issuance", state.disputes[0][0].hex(),
                       lambda: _open_queued_dispute(state, n, block_hash), parent,
                       state.runs.get(parent.run_id) if parent else None)
        for run in sorted(state.runs.values(), key=lambda r: r.run_id):
            _contained(state, events, n, "issuance", run.run_id.hex(),
                       lambda r=run: _issue_due(state, r, n, block_hash, p), run)
    with _stage(events, n, "resolution"):
        due = [
            ch
            for ch in state.challenges.values()
            if ch.verdict is None
            and (n > ch.escalate_deadline or (ch.opening is None and n > ch.opening_deadline))
        ]
        for ch in sorted(due, key=lambda c: (c.issued, c.run_id, c.index, c.round)):
            parent = state.challenges.get(ch.escalated) if ch.escalated else None
            _contained(state, events, n, "resolution", ch.challenge_id.hex(),
                       lambda c=ch: _resolve(state, c, n, block_hash), ch, state.runs.get(ch.run_id), parent)
    return events


def _issue_due(
    state: ProtocolState, run: RunState, n: int, block_hash: bytes, p: ProtocolParams
) -> list[Event]:
    """The run's next first-round challenge, when its turn has come and the network has the free
    seats for a full committee: committee_size seat units free, or every unit when the network has
    fewer (seats of open rounds hold theirs until settled, so a challenge waits for them rather
    than sit a smaller committee); when every round is a dispute round, none may be open."""
    if run.settled or run.challenges_at is None or run.challenges_at > n:
        return []
    if run.drawn >= min(p.challenges_per_run, run.size - 1):
        return []
    if _seats(p, 1) is None and any(c.dispute and c.verdict is None for c in state.challenges.values()):
        return []  # every round is a dispute round (max_rounds 1): one at a time
    units = seat_units(eligible_verifiers(state, exclude=run.miner), p.verifier_stake)
    free = sum(k for _, k in units)
    total = sum(b // p.verifier_stake for a, b in state.vbonds.items() if a != run.miner)
    if free == 0 or free < min(p.committee_size, total):
        return []
    return _issue_first(state, run, n, block_hash)


class _Savepoint:
    """What one item of a block's work may change, copied before it runs so that an item that fails
    halfway is undone exactly: the parameters and their schedule, the active and reserved bonds,
    the registry, unbonding amounts, penalties, payments and burns, the item's own run and challenge (restored
    in place), and the runs and challenges it added (dicts keep insertion order: they are the last ones)."""

    def __init__(self, state: ProtocolState, *objects: Any) -> None:
        self.state = state
        self.scalars = (state.params, state.configured_at, state.authority, state.burned)
        self.schedule = copy.deepcopy(state.schedule)
        self.slashed, self.vbonds = dict(state.slashed), dict(state.vbonds)
        self.reserved, self.paid, self.verifiers = (
            dict(state.reserved),
            dict(state.paid),
            list(state.verifiers),
        )
        self.staked, self.disputes = dict(state.staked), [list(x) for x in state.disputes]
        self.unbonding = {k: [list(x) for x in v] for k, v in state.unbonding.items()}
        self.objects = [(o, copy.deepcopy(o)) for o in objects if o is not None]
        self.sizes = (len(state.runs), len(state.challenges))

    def restore(self) -> None:
        s = self.state
        s.params, s.configured_at, s.authority, s.burned = self.scalars
        s.schedule, s.slashed, s.vbonds, s.unbonding = (
            self.schedule,
            self.slashed,
            self.vbonds,
            self.unbonding,
        )
        s.reserved, s.paid, s.verifiers = self.reserved, self.paid, self.verifiers
        s.staked, s.disputes = self.staked, self.disputes
        for obj, saved in self.objects:
            for f in dataclass_fields(obj):
                setattr(obj, f.name, getattr(saved, f.name))
        for table, size in zip((s.runs, s.challenges), self.sizes, strict=True):
            while len(table) > size:
                del table[next(reversed(table))]


def _contained(state: ProtocolState, events: list[Event], n: int, stage: str, subject: str,
               work: Callable[[], list[Event]], *objects: Any) -> bool:
    """Run one item of a block's work; if it fails, undo it and record `BlockWorkFailed` (the
    exception's type only: the record is the same, and as small, on every node). True if it ran."""
    point = _Savepoint(state, *objects)
    try:
        done = work()
    except Exception as exc:
        point.restore()
        events.append(BlockWorkFailed(n, stage, subject, type(exc).__name__))
        return False
    events += done
    return True


@contextmanager
def _stage(events: list[Event], n: int, stage: str) -> Iterator[None]:
    """A stage's own steps (which items are due) outside any item: a failure there ends the stage
    for this block, recorded; what its items did before stands (each one whole)."""
    try:
        yield
    except Exception as exc:
        events.append(BlockWorkFailed(n, stage, "", type(exc).__name__))


def _issue_first(state: ProtocolState, run: RunState, n: int, block_hash: bytes) -> list[Event]:
    """The run's next first-round challenge, drawn from this block's hash alone (one block per
    challenge: an author that re-seals its block steers only its own draw)."""
    assert run.root is not None
    p = state.params
    index = run.drawn
    # The steps of the first rounds only: a re-challenge repeats its step, and counting it again
    # would switch the spacing rule off early and, once the repeats reach the run's step count,
    # make challenge_step_at refuse a draw with steps still free.
    taken = [state.challenges[c].step for c in run.challenges if state.challenges[c].round == 1]
    step = challenge_step_at(
        block_hash, run.run_id, run.root, run.size, index, taken, p.forced_challenge_steps
    )
    cid = derive_challenge_id(run.run_id, run.root, run.size, index, block_hash)
    run.drawn += 1
    return _open_round(state, run, cid, index, step, n, block_hash, round_=1, first=None, refused_rounds=0)


def _seats(p: ProtocolParams, round_: int) -> int | None:
    """The committee size of a round: committee_size doubled each round; None (every eligible
    verifier) from round max_rounds on."""
    if round_ >= p.max_rounds:
        return None
    return min(p.committee_size << (round_ - 1), MAX_COMMITTEE)


def _open_round(
    state: ProtocolState,
    run: RunState,
    cid: bytes,
    index: int,
    step: int,
    n: int,
    block_hash: bytes,
    *,
    round_: int,
    first: bytes | None,
    refused_rounds: int,
    escalated: bytes | None = None,
) -> list[Event]:
    p = state.params
    seats = _seats(p, round_)
    if seats is None:
        # the dispute round, one at a time: every unit of bond sits (state.dispute_bonds: less
        # escalation stakes and what seats of other rounds may still be charged), at most
        # MAX_DISPUTE_SEATS seats, exactly proportional to units (challenges.derive.dispute_seats);
        # its seats hold outside `reserved`
        bonds = dispute_bonds(state, exclude=run.miner)
        committee = dispute_seats(block_hash, cid, seat_units(bonds, p.verifier_stake), MAX_DISPUTE_SEATS)
    else:
        units = seat_units(eligible_verifiers(state, exclude=run.miner), p.verifier_stake)
        committee = draw_committee(block_hash, cid, units, seats)
    held = Counter(committee)
    for account in sorted(held):  # every seat holds its collateral for the round's life
        held[account] *= p.verifier_stake
        if seats is not None:
            _reserve(state, account, held[account])
    opening_deadline = n + run.opening_blocks * round_
    commit_deadline = opening_deadline + max(p.commit_window, run.replay_blocks) * round_
    reveal_deadline = commit_deadline + p.reveal_window * round_
    ch = ChallengeState(
        challenge_id=cid,
        run_id=run.run_id,
        index=index,
        step=step,
        root=run.root,
        size=run.size,
        mode=run.mode,
        issued=n,
        opening_deadline=opening_deadline,
        commit_deadline=commit_deadline,
        reveal_deadline=reveal_deadline,
        round=round_,
        first=first,
        committee=committee,
        refused_rounds=refused_rounds,
        collateral=p.verifier_stake,
        held=dict(held),
        escalate_deadline=reveal_deadline + (0 if seats is None else p.escalation_window),
        dispute=seats is None,
        escalated=escalated,
    )
    state.challenges[cid] = ch
    run.challenges.append(cid)
    return [ChallengeIssued(n, cid, run.run_id, index, step, run.root, run.size, run.mode, run.endpoint,
                            ch.opening_deadline, ch.commit_deadline, ch.reveal_deadline, round_, first,
                            tuple(committee), ch.escalate_deadline)]


def _next_round(state: ProtocolState, parent: ChallengeState, round_: int, reopened: bool, n: int,
                block_hash: bytes) -> list[Event]:
    """Open the round after `parent` (a re-challenge, a reopened window or its dispute round). A
    dispute round waits in `state.disputes` while another is open: one dispute at a time seats the
    whole stake."""
    p = state.params
    if _seats(p, round_) is None and any(c.dispute and c.verdict is None for c in state.challenges.values()):
        parent.queued = True
        state.disputes.append([parent.challenge_id, round_, reopened])
        return []
    run = state.runs[parent.run_id]
    first = parent.first or parent.challenge_id
    nxt = rechallenge_id(first, round_, block_hash)
    parent.rechallenge, parent.queued = nxt, False
    return _open_round(state, run, nxt, parent.index, parent.step, n, block_hash, round_=round_, first=first,
                       refused_rounds=parent.refused_rounds + reopened,
                       escalated=parent.challenge_id if parent.pending else None)


def _open_queued_dispute(state: ProtocolState, n: int, block_hash: bytes) -> list[Event]:
    """The first queued dispute round, once no dispute round is open."""
    if not state.disputes or any(c.dispute and c.verdict is None for c in state.challenges.values()):
        return []
    cid, round_, reopened = state.disputes.pop(0)
    return _next_round(state, state.challenges[cid], round_, reopened, n, block_hash)


def _decide(state: ProtocolState, ch: ChallengeState) -> VerdictResult:
    """The clustering verdict of a round's reveals (challenges.verdict.decide), seats weighed."""
    p = state.params
    seats = Counter(ch.committee)
    return decide(
        [Reveal(v, r[0], r[1], r[2]) for v, r in ch.reveals.items() if v in seats],
        mode=ch.mode,  # type: ignore[arg-type]
        opening_submitted=ch.opening is not None,
        expected_value=ch.opening["leaf_hash"] if ch.opening else None,
        declared_bucket=ch.declared_bucket,
        quorum_min_reveals=p.quorum_min_reveals,
        quorum_share=p.quorum_share,
        committee_size=len(ch.committee),
        seats=seats,
        dispute=ch.dispute,
        refused_value=refused_value_hash(ch.challenge_id),
        refused_bucket=REFUSED_BUCKET,
        honest_share=p.dispute_honest_share,
    )


def round_result(state: ProtocolState, challenge_id: bytes) -> VerdictResult:
    """What the open round would resolve to now, from the reveals on chain: what a seat reads after
    the reveal deadline to decide whether to escalate (`escalate_challenge`)."""
    return _decide(state, _challenge(state, challenge_id))


def _final_value(ch: ChallengeState, result: VerdictResult) -> bool:
    """Whether a round's result is a verdict a dissenting seat may escalate: honest or fraud, or a
    refusal that is final (the step's second refused round: fraud). A first refusal only reopens
    the opening window, which costs the miner nothing."""
    return result.verdict in (HONEST, FRAUD) or (result.verdict == REFUSED and ch.refused_rounds > 0)


def _value_of(ch: ChallengeState, reveal: list[Any]) -> bytes | int:
    return reveal[0] if ch.mode == "value" else reveal[1]


def _resolve(state: ProtocolState, ch: ChallengeState, n: int, block_hash: bytes) -> list[Event]:
    p = state.params
    run = state.runs[ch.run_id]
    result = _decide(state, ch)
    verdict, reason, follow = result.verdict, result.reason, None
    escalated = bool(ch.escalations) and _final_value(ch, result)
    if escalated:
        verdict, follow = INCONCLUSIVE, "escalate"
        reason = (f"{reason}; escalated to the dispute round by {len(ch.escalations)} account(s) "
                  f"staking {sum(e[1] for e in ch.escalations.values())}")
    elif verdict == REFUSED:
        if ch.refused_rounds == 0:
            verdict, follow = INCONCLUSIVE, "reopen"
            reason = f"{reason}: the miner gets a second opening window"
        else:
            verdict = FRAUD
            reason = f"{reason} again: no usable opening in two opening windows"
    elif verdict == INCONCLUSIVE and ch.opening is not None:
        if ch.dispute:
            reason = (f"{reason}; unresolved after the dispute round: the miner's stake stays locked and the "
                      f"run's escrow is forfeited")
        else:
            follow = "rechallenge"
            reason = f"{reason}: re-challenged with a larger committee"
    events: list[Event] = []
    nxt, next_round = None, None
    if follow is not None:
        next_round = max(ch.round + 1, p.max_rounds) if follow == "escalate" else ch.round + 1
        if _seats(p, next_round) is None and any(
            c.dispute and c.verdict is None for c in state.challenges.values()
        ):
            reason = f"{reason}; its dispute round waits for the open one to resolve"
        else:
            nxt = rechallenge_id(ch.first or ch.challenge_id, next_round, block_hash)
    ch.verdict = verdict
    events.append(ChallengeResolved(
        n, ch.challenge_id, ch.run_id, ch.step, verdict, reason, result.mode,
        result.winning_value, result.cluster_size, result.reveals, result.clusters, result.outliers,
        ch.round, nxt,
    ))
    seats = Counter(ch.committee)  # penalties and fees are per seat held
    # A dispute round's penalties, and those of the round it settles, pay its winning seats (the
    # escrow pays for the rounds below it); other rounds' penalties are burned.
    pooled = ch.dispute and not escalated
    mark = len(events)
    if ch.opening is not None:  # with no opening on chain there was nothing to witness
        for v in sorted(seats):
            if v not in ch.commitments:
                events += _penalize(
                    state, ch, v, p.no_show_penalty * seats[v], "no_commit", n, burn=not pooled
                )
            elif v not in ch.reveals:
                events += _penalize(
                    state, ch, v, p.no_show_penalty * seats[v], "no_reveal", n, burn=not pooled
                )
    pools: list[tuple[str, int]] = []
    if escalated:
        ch.pending = True  # its seats stay reserved: the dispute round settles them and its escalations
    else:
        for v in result.outliers:
            value_hash, bucket = ch.reveals[v][0], ch.reveals[v][1]
            events.append(VerifierOutlier(n, ch.challenge_id, v, value_hash, bucket))
            events += _penalize(state, ch, v, p.outlier_penalty * seats[v], "outlier", n, burn=not pooled)
        if ch.escalated is not None:
            ruled = verdict if verdict in (HONEST, FRAUD) else None
            settled, forfeited = _settle_escalated(state, state.challenges[ch.escalated], ruled, n)
            events += settled
            pools.append(("dispute_pool", forfeited))
        if pooled:
            pools.append(
                ("dispute_pool", sum(e.amount for e in events[mark:] if isinstance(e, VerifierPenalized)))
            )
        if verdict == FRAUD:
            amount = min(p.slash_amount, run.stake - run.slashed)
            run.slashed += amount
            state.slashed[run.miner] = min(state.slashed.get(run.miner, 0) + amount, INT63)  # saturating
            events.append(MinerSlashed(n, run.run_id, ch.challenge_id, run.miner, amount, reason))
            share = amount * p.slash_reward_share.numerator // p.slash_reward_share.denominator
            pools.append(("slash_share", share))
            events += _burn(state, ch.challenge_id, amount - share, "the slash not paid to seats", n)
        winners = (
            Counter({v: seats[v] for v in result.winners})
            if verdict in (HONEST, FRAUD) or follow == "reopen"
            else Counter()
        )
        events += _pay_seats(state, ch, run, winners, pools, n)
        _free_seats(state, ch)
    if ch.escalations and not escalated:
        # escalations of a round whose result is no longer a verdict (a parameter change between
        # the escalation and the resolution): nothing to dispute, every stake goes back
        events += _return_escalations(state, ch, n)
    if next_round is not None:
        events += _next_round(state, ch, next_round, follow == "reopen", n, block_hash)
    events += _settle_run(state, run, n)
    return events


def _settle_escalated(state: ProtocolState, parent: ChallengeState, ruled: str | None,
                      n: int) -> tuple[list[Event], int]:
    """Settle an escalated round by its dispute round's verdict `ruled` ("honest", "fraud", or None:
    unresolved). Honest: its seats that revealed another value than the miner's pay
    outlier_penalty a seat; fraud: its seats that backed the miner's value do. Every seat's hold is
    then freed. An escalator gets its stake back only if the dispute ruled against the verdict it
    disputed; otherwise, an unresolved dispute included, the stake is forfeited, so escalating to
    grief costs the stake. Returns the events and the forfeited total (the dispute's pool)."""
    p = state.params
    seats = Counter(parent.committee)
    mine = (
        parent.opening["leaf_hash"] if parent.mode == "value" and parent.opening else parent.declared_bucket
    )
    events: list[Event] = []
    if ruled is not None:
        for v in sorted(parent.reveals):
            backed = _value_of(parent, parent.reveals[v]) == mine
            if v in seats and backed == (ruled == FRAUD):
                events += _penalize(state, parent, v, p.outlier_penalty * seats[v], "outlier", n, burn=False)
    forfeited = 0
    for v in sorted(parent.escalations):
        disputed, stake = parent.escalations[v]
        wrong = ruled is None or ruled == disputed
        _unstake(state, v, stake)
        if wrong:  # paid in full: escalation_room kept the stake out of every penalty's reach
            state.vbonds[v] -= stake
            state.slashed[v] = min(state.slashed.get(v, 0) + stake, INT63)
            forfeited += stake
        events.append(
            EscalationSettled(n, parent.challenge_id, v, 0 if wrong else stake, stake if wrong else 0)
        )
    parent.escalations = {}
    _free_seats(state, parent)
    return events, forfeited


def _unstake(state: ProtocolState, account: str, stake: int) -> None:
    """An escalation stake is no longer held (returned or forfeited by the caller)."""
    _unreserve(state, account, stake)
    left = state.staked.get(account, 0) - stake
    if left:
        state.staked[account] = left
    else:
        state.staked.pop(account, None)


def _return_escalations(state: ProtocolState, ch: ChallengeState, n: int) -> list[Event]:
    events: list[Event] = []
    for v in sorted(ch.escalations):
        _, stake = ch.escalations[v]
        _unstake(state, v, stake)
        events.append(EscalationSettled(n, ch.challenge_id, v, stake, 0))
    ch.escalations = {}
    return events


def _settle_run(state: ProtocolState, run: RunState, n: int) -> list[Event]:
    """Once every challenge of the run is drawn and resolved: release the miner's stake (less its
    slashes) and what is left of the escrow, or, when a challenge ended unresolved after its
    dispute round, keep the stake locked and burn the escrow."""
    p = state.params
    if run.settled or run.challenges_at is None or run.drawn < min(p.challenges_per_run, run.size - 1):
        return []
    rounds = [state.challenges[c] for c in run.challenges]
    if any(ch.verdict is None or ch.pending or ch.queued for ch in rounds):
        return []
    unresolved = sum(
        1 for ch in rounds if ch.verdict == INCONCLUSIVE and ch.rechallenge is None and ch.opening
    )
    run.settled = True
    escrow, run.escrow_left = run.escrow_left, 0
    if unresolved:
        events = _burn(state, run.run_id, escrow, "the escrow of a run left unresolved", n)
        return [*events, RunSettled(n, run.run_id, run.miner, 0, 0, escrow, unresolved)]
    return [RunSettled(n, run.run_id, run.miner, run.stake - run.slashed, escrow, 0, 0)]
