"""The protocol state: runs, challenges, bonds and slashes as plain data (deep-copyable), and its
CBOR snapshot form, so that a follower can restart from a cursor without replaying the chain."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from chain.protocol.params import (
    MAX_DECLARED_STEPS,
    MAX_DISPUTE_SEATS,
    MAX_ENDPOINT_BYTES,
    MAX_LEAF_BYTES,
    MAX_MIRRORS,
    MAX_SCHEDULED_CHANGES,
    MAX_UNBONDING_PER_VERIFIER,
    MAX_URI_BYTES,
    MAX_WITNESSES_PER_CHALLENGE,
    ProtocolParams,
)
from challenges.verdict import FRAUD, HONEST, INCONCLUSIVE
from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import digest

SNAPSHOT_VERSION = "pot/protocol-state/v3"


@dataclass
class RunState:
    run_id: bytes
    miner: str
    registration: bytes  # digest of the encoded registration fields: an identical repeat is a no-op
    spec_digest: bytes
    mode: str
    declared_steps: int
    endpoint: str
    stake: int
    slashed: int = 0
    root: bytes | None = None
    size: int = 0
    challenges_at: int | None = None  # the block of the first challenge; one more each block after
    challenges: list[bytes] = field(default_factory=list)  # every round's challenge ids, in issue order
    replay_blocks: int = 1  # the commit window this run's replay needs (chain.protocol.cost)
    drawn: int = 0  # first-round challenges issued so far
    checkpoint_interval: int = 1  # the most steps between two states the miner keeps
    opening_blocks: int = 1  # the run's opening window per round (>= opening_deadline)
    seat_fee: int = 0  # paid per seat of a resolved round's winning cluster
    escrow: int = 0  # the fees escrowed at registration
    escrow_left: int = 0  # what the escrow still holds
    settled: bool = False  # every challenge resolved: stake and escrow released (or locked and burned)


@dataclass
class ChallengeState:
    challenge_id: bytes
    run_id: bytes
    index: int
    step: int
    root: bytes
    size: int
    mode: str
    issued: int
    opening_deadline: int
    commit_deadline: int
    reveal_deadline: int
    opening: dict[str, Any] | None = None  # opening_digest, uri, mirrors, leaf, leaf_hash, block
    declared_bucket: int | None = None
    commitments: dict[str, bytes] = field(default_factory=dict)
    # verifier -> [value_hash, bucket, proof_hash]
    reveals: dict[str, list[Any]] = field(default_factory=dict)
    rejected: list[list[Any]] = field(default_factory=list)  # [block, verifier, reason]
    verdict: str | None = None
    round: int = 1
    first: bytes | None = None  # the first round's id (None for a first round)
    committee: list[str] = field(default_factory=list)
    refused_rounds: int = 0  # earlier rounds of this step whose committee refused the opening
    rechallenge: bytes | None = None  # the next round, once this one re-challenged
    # Protocol v3. Every seat reserves `collateral` of its account's free bond; `held` is what each
    # account's seats still reserve (penalties are taken from it; the rest is freed when the round
    # is settled). The last block an escalation is accepted (the reveal deadline in a dispute round).
    collateral: int = 0
    held: dict[str, int] = field(default_factory=dict)
    escalate_deadline: int = 0
    dispute: bool = False  # every seat unit of the network sits (the dispute round)
    # account -> [the verdict it disputes ("honest" or "fraud"), stake]: the escalations of this round
    escalations: dict[str, list[Any]] = field(default_factory=dict)
    escalated: bytes | None = None  # a dispute round: the escalated round it settles
    pending: bool = False  # an escalated round, waiting for its dispute round to settle it
    queued: bool = False  # its dispute round waits in the queue behind the open one


@dataclass
class ProtocolState:
    """Everything the protocol knows. Plain data: deep-copyable and CBOR-serialisable."""

    params: ProtocolParams = field(default_factory=ProtocolParams)
    head: int = -1  # the last block passed to on_block
    runs: dict[bytes, RunState] = field(default_factory=dict)
    challenges: dict[bytes, ChallengeState] = field(default_factory=dict)
    bonds: dict[str, int] = field(default_factory=dict)  # account -> stake ever bonded (before slashes)
    slashed: dict[str, int] = field(default_factory=dict)  # account -> total slashed or penalised
    verifiers: list[str] = field(default_factory=list)  # accounts that bonded as verifiers, first bond first
    vbonds: dict[str, int] = field(default_factory=dict)  # verifier -> active bond (reserved included)
    # verifier -> bond reserved by its seats of rounds below the dispute round and its escalation
    # stakes; `staked` is the escalation stakes alone (a dispute round's seats leave them out).
    reserved: dict[str, int] = field(default_factory=dict)
    staked: dict[str, int] = field(default_factory=dict)
    # Dispute rounds waiting for the open one to resolve (one dispute round at a time, so each
    # seats the whole stake): [escalated or re-challenged round's id, the dispute round's number,
    # whether it reopens a refused opening].
    disputes: list[list[Any]] = field(default_factory=list)
    burned: int = 0  # units taken out of circulation (saturating)
    paid: dict[str, int] = field(default_factory=dict)  # verifier -> fees and shares credited (running total)
    unbonding: dict[str, list[list[int]]] = field(
        default_factory=dict
    )  # verifier -> [[release_block, amount]]
    # The network record (configure_network): its authority once one is accepted (or pinned by the
    # follower before any), the block of the accepted record taken last, and the changes waiting
    # for their block as [effective_block, configured_at, params dict], in effective order.
    authority: str | None = None
    configured_at: int | None = None
    schedule: list[list[Any]] = field(default_factory=list)

    # Snapshots let a ChainView restart from a cursor without replaying the chain.
    def to_cbor(self) -> bytes:
        return cbor.encode({
            "version": SNAPSHOT_VERSION,
            "params": self.params.to_dict(),
            "head": self.head,
            "runs": [_row(r) for r in self.runs.values()],
            "challenges": [_row(c) for c in self.challenges.values()],
            "bonds": dict(self.bonds),
            "slashed": dict(self.slashed),
            "verifiers": list(self.verifiers),
            "vbonds": dict(self.vbonds),
            "reserved": dict(self.reserved),
            "staked": dict(self.staked),
            "disputes": [list(x) for x in self.disputes],
            "burned": self.burned,
            "paid": dict(self.paid),
            "unbonding": {k: [list(x) for x in v] for k, v in self.unbonding.items()},
            "authority": self.authority,
            "configured_at": self.configured_at,
            "schedule": [list(x) for x in self.schedule],
        })

    @classmethod
    def from_cbor(cls, data: bytes) -> ProtocolState:
        """The state of a `to_cbor` snapshot, checked field by field: every integer in its range,
        every byte string its length, every list and map its shape, every challenge's run and every
        run's challenges present. Anything else is a SnapshotError naming the field."""
        try:
            # Rows of short-keyed maps of integers cost about 11x their bytes as Python objects (a
            # busy network's snapshot: 10.7x charged, 6.1x traced), past the decoder's default 4x.
            obj = cbor.decode(data, max_memory=cbor.memory_budget(len(data), ratio=16))
            version = obj.get("version") if isinstance(obj, dict) else None
            if (
                isinstance(version, str)
                and version.startswith("pot/protocol-state/")
                and version != SNAPSHOT_VERSION
            ):
                raise ValueError(
                    f"a {version} snapshot, of another protocol version; this node reads "
                    f"{SNAPSHOT_VERSION}: derive the state again from the chain (drop the snapshot)"
                )
            if version != SNAPSHOT_VERSION:
                raise ValueError(f"not a {SNAPSHOT_VERSION} snapshot")
            unknown = set(obj) - _STATE_KEYS
            if unknown:
                raise ValueError(f"unknown field(s) {', '.join(sorted(map(repr, unknown)))}")
            runs = _rows(obj["runs"], "runs", RunState, _RUN_FIELDS)
            for r in runs:  # snapshots of older nodes kept the whole encoded registration
                if len(r.registration) != 32:
                    r.registration = registration_digest(r.registration)
            challenges = _rows(obj["challenges"], "challenges", ChallengeState, _CHALLENGE_FIELDS)
            state = cls(
                params=ProtocolParams.from_dict(obj["params"]),
                head=_int(obj["head"], "head", lo=-1),
                runs=_keyed(runs, "run_id", "runs"),
                challenges=_keyed(challenges, "challenge_id", "challenges"),
                bonds=_int_map(obj["bonds"], "bonds"),
                slashed=_int_map(obj["slashed"], "slashed"),
                verifiers=_accounts(obj["verifiers"], "verifiers"),
                vbonds=_int_map(obj["vbonds"], "vbonds"),
                reserved=_int_map(obj["reserved"], "reserved"),
                staked=_int_map(obj["staked"], "staked"),
                disputes=_disputes(obj["disputes"]),
                burned=_int(obj["burned"], "burned"),
                paid=_int_map(obj["paid"], "paid"),
                unbonding=_unbonding(obj["unbonding"]),
                # Snapshots of nodes older than the network record have none of these.
                authority=_optional(obj.get("authority"), str, "authority"),
                configured_at=_optional(obj.get("configured_at"), int, "configured_at"),
                schedule=_schedule(obj.get("schedule", [])),
            )
            _check_links(state)
            return state
        except (AttributeError, CommitmentError, KeyError, TypeError, ValueError, RecursionError) as exc:
            raise SnapshotError(f"protocol state snapshot is unusable: {exc}") from None


class SnapshotError(ValueError):
    """A persisted protocol state that cannot be restored, with the reason."""


def registration_digest(encoded: bytes) -> bytes:
    """What a run keeps of its registration: enough to know an identical repeat, 32 bytes
    whatever the spec's size."""
    return digest("pot/registration/v1", bytes(encoded))


U64 = (1 << 64) - 1  # the wire's `uint` (docs/protocol.md §2.2): no state integer exceeds it
_STATE_KEYS = {
    "version",
    "params",
    "head",
    "runs",
    "challenges",
    "bonds",
    "slashed",
    "verifiers",
    "vbonds",
    "reserved",
    "staked",
    "disputes",
    "burned",
    "paid",
    "unbonding",
    "authority",
    "configured_at",
    "schedule",
}
_VERDICTS = (HONEST, FRAUD, INCONCLUSIVE)
_MODES = ("value", "bucket")


def _int(v: Any, name: str, lo: int = 0, hi: int = U64) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {_kind(v)}")
    return v


def _kind(v: Any) -> str:
    """What a refused value is, without its bytes (a snapshot may be large)."""
    return (
        repr(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 70 else type(v).__name__
    )


def _bytes(v: Any, name: str, size: int | None = 32, most: int | None = None) -> bytes:
    if (
        not isinstance(v, bytes)
        or (size is not None and len(v) != size)
        or (most is not None and len(v) > most)
    ):
        want = (
            f"{size} bytes" if size is not None else f"at most {most} bytes" if most is not None else "bytes"
        )
        got = f"{len(v)} bytes" if isinstance(v, bytes) else type(v).__name__
        raise ValueError(f"{name} must be {want}, got {got}")
    return v


def _text(v: Any, name: str, most: int | None = None) -> str:
    if not isinstance(v, str) or (most is not None and len(v.encode("utf-8", "surrogatepass")) > most):
        raise ValueError(f"{name} must be text" + (f" of at most {most} bytes" if most is not None else ""))
    return v


def _maybe(check: Callable[..., Any]) -> Callable[..., Any]:
    return lambda v, name: None if v is None else check(v, name)


def _choice(options: tuple[str, ...]) -> Callable[[Any, str], str]:
    def check(v: Any, name: str) -> str:
        if v not in options or not isinstance(v, str):
            raise ValueError(f"{name} must be one of {', '.join(options)}")
        return v
    return check


def _list_of(item: Callable[[Any, str], Any], most: int | None = None) -> Callable[[Any, str], list[Any]]:
    def check(v: Any, name: str) -> list[Any]:
        if not isinstance(v, list) or (most is not None and len(v) > most):
            raise ValueError(
                f"{name} must be a list" + (f" of at most {most} entries" if most is not None else "")
            )
        return [item(x, f"{name}[{i}]") for i, x in enumerate(v)]
    return check


def _map_of(
    value: Callable[[Any, str], Any], most: int | None = None
) -> Callable[[Any, str], dict[str, Any]]:
    def check(v: Any, name: str) -> dict[str, Any]:
        if not isinstance(v, dict) or (most is not None and len(v) > most):
            raise ValueError(f"{name} must be a map of account -> value"
                             + (f", at most {most} entries" if most is not None else ""))
        return {_text(k, f"a key of {name}"): value(x, f"{name}[{k!r}]") for k, x in v.items()}
    return check


def _b32(v: Any, name: str) -> bytes:
    return _bytes(v, name)


def _uint(v: Any, name: str) -> int:
    return _int(v, name)


def _bucket(v: Any, name: str) -> int:
    return _int(v, name, lo=-(1 << 31), hi=(1 << 31) - 1)


def _reveal(v: Any, name: str) -> list[Any]:
    if not (isinstance(v, list) and len(v) == 3):
        raise ValueError(f"{name} must be [value_hash, bucket, proof_hash]")
    return [
        _b32(v[0], f"{name} value_hash"),
        _bucket(v[1], f"{name} bucket"),
        _b32(v[2], f"{name} proof_hash"),
    ]


def _rejected(v: Any, name: str) -> list[Any]:
    if not (isinstance(v, list) and len(v) == 3):
        raise ValueError(f"{name} must be [block, verifier, reason]")
    return [_uint(v[0], f"{name} block"), _text(v[1], f"{name} verifier"), _text(v[2], f"{name} reason")]


_OPENING_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "opening_digest": _b32,
    "uri": lambda v, name: _text(v, name, MAX_URI_BYTES),
    "mirrors": _list_of(lambda v, name: _text(v, name, MAX_URI_BYTES), MAX_MIRRORS),
    "leaf": lambda v, name: _bytes(v, name, None, MAX_LEAF_BYTES),
    "leaf_hash": _b32,
    "block": _uint,
}


def _opening(v: Any, name: str) -> dict[str, Any]:
    if not isinstance(v, dict) or set(v) != set(_OPENING_FIELDS):
        raise ValueError(f"{name} must be a map of {', '.join(_OPENING_FIELDS)}")
    return {k: check(v[k], f"{name}.{k}") for k, check in _OPENING_FIELDS.items()}


_RUN_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "run_id": _b32,
    "miner": _text,
    "registration": lambda v, name: _bytes(v, name, None, 1 << 20),  # older nodes: the whole registration
    "spec_digest": _b32,
    "mode": _choice(_MODES),
    "declared_steps": lambda v, name: _int(v, name, hi=MAX_DECLARED_STEPS),
    "endpoint": lambda v, name: _text(v, name, MAX_ENDPOINT_BYTES),
    "stake": _uint,
    "slashed": _uint,
    "root": _maybe(_b32),
    "size": _uint,
    "challenges_at": _maybe(_uint),
    "challenges": _list_of(_b32),
    "replay_blocks": lambda v, name: _int(v, name, lo=1),
    "drawn": _uint,
    "checkpoint_interval": lambda v, name: _int(v, name, lo=1),
    "opening_blocks": lambda v, name: _int(v, name, lo=1),
    "seat_fee": _uint,
    "escrow": _uint,
    "escrow_left": _uint,
    "settled": lambda v, name: _flag(v, name),
}

_CHALLENGE_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "challenge_id": _b32,
    "run_id": _b32,
    "index": _uint,
    "step": _uint,
    "root": _b32,
    "size": lambda v, name: _int(v, name, lo=1),
    "mode": _choice(_MODES),
    "issued": _uint,
    "opening_deadline": _uint,
    "commit_deadline": _uint,
    "reveal_deadline": _uint,
    "opening": _maybe(_opening),
    "declared_bucket": _maybe(_bucket),
    "commitments": _map_of(_b32, MAX_WITNESSES_PER_CHALLENGE),
    "reveals": _map_of(_reveal, MAX_WITNESSES_PER_CHALLENGE),
    "rejected": _list_of(_rejected, MAX_WITNESSES_PER_CHALLENGE),
    "verdict": _maybe(_choice(_VERDICTS)),
    "round": lambda v, name: _int(v, name, lo=1, hi=64),
    "first": _maybe(_b32),
    "committee": _list_of(_text, MAX_DISPUTE_SEATS),
    "refused_rounds": _uint,
    "rechallenge": _maybe(_b32),
    "collateral": _uint,
    "held": _map_of(_uint, MAX_WITNESSES_PER_CHALLENGE),
    "escalate_deadline": _uint,
    "dispute": lambda v, name: _flag(v, name),
    "escalations": _map_of(lambda v, name: _escalation(v, name), MAX_WITNESSES_PER_CHALLENGE),
    "escalated": _maybe(_b32),
    "pending": lambda v, name: _flag(v, name),
    "queued": lambda v, name: _flag(v, name),
}


def _disputes(v: Any) -> list[list[Any]]:
    if not isinstance(v, list):
        raise ValueError("disputes must be a list")
    out = []
    for i, row in enumerate(v):
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError(f"disputes[{i}] must be [round id, round, reopened]")
        out.append(
            [
                _b32(row[0], f"disputes[{i}] round id"),
                _int(row[1], f"disputes[{i}] round", lo=1, hi=64),
                _flag(row[2], f"disputes[{i}] reopened"),
            ]
        )
    return out


def _flag(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be true or false")
    return v


def _escalation(v: Any, name: str) -> list[Any]:
    if not (isinstance(v, list) and len(v) == 2):
        raise ValueError(f"{name} must be [value, stake]")
    return [_choice((HONEST, FRAUD))(v[0], f"{name} verdict"), _uint(v[1], f"{name} stake")]


def _rows(v: Any, name: str, kind: type, spec: dict[str, Callable[[Any, str], Any]]) -> list[Any]:
    """Rows of `_row` form, each a map of exactly the dataclass's fields (those with a default may
    be missing: snapshots of older nodes), each field checked."""
    if not isinstance(v, list):
        raise ValueError(f"{name} must be a list")
    required = {f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING}
    out = []
    for i, row in enumerate(v):
        where = f"{name}[{i}]"
        if not isinstance(row, dict):
            raise ValueError(f"{where} must be a map")
        unknown, missing = set(row) - set(spec), required - set(row)
        if unknown or missing:
            raise ValueError(f"{where}: " + "; ".join(
                [*(["unknown field(s) " + ", ".join(sorted(map(repr, unknown)))] if unknown else []),
                 *(["missing field(s) " + ", ".join(sorted(missing))] if missing else [])]))
        out.append(kind(**{k: spec[k](x, f"{where}.{k}") for k, x in row.items()}))
    return out


def _keyed(rows: list[Any], key: str, name: str) -> dict[bytes, Any]:
    out = {getattr(r, key): r for r in rows}
    if len(out) != len(rows):
        raise ValueError(f"{name} lists the same {key} twice")
    return out


def _accounts(v: Any, name: str) -> list[str]:
    out = _list_of(_text)(v, name)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} lists an account twice")
    return out


def _check_links(state: ProtocolState) -> None:
    """What on_block relies on between the tables: each challenge's run exists and lists it, each
    run's challenges exist, a run slashed no more than its stake, the deadlines in order."""
    for a, held in state.staked.items():
        if held > state.reserved.get(a, 0):
            raise ValueError(
                f"{a!r} has {held} staked on escalations but {state.reserved.get(a, 0)} reserved"
            )
    for r in state.runs.values():
        if r.escrow_left > r.escrow:
            raise ValueError(f"run {r.run_id.hex()[:16]} holds more escrow than it escrowed")
        if r.slashed > r.stake:
            raise ValueError(f"run {r.run_id.hex()[:16]} is slashed more than its stake")
        if r.size > r.declared_steps + 1:
            raise ValueError(
                f"run {r.run_id.hex()[:16]} has a root of size {r.size} for {r.declared_steps} steps"
            )
        for cid in r.challenges:
            ch = state.challenges.get(cid)
            if ch is None or ch.run_id != r.run_id:
                raise ValueError(
                    f"run {r.run_id.hex()[:16]} lists challenge {cid.hex()[:16]}, which is not its"
                )
    for ch in state.challenges.values():
        run = state.runs.get(ch.run_id)
        if run is None or ch.challenge_id not in run.challenges:
            raise ValueError(f"challenge {ch.challenge_id.hex()[:16]} belongs to no run that lists it")
        if not ch.issued <= ch.opening_deadline <= ch.commit_deadline <= ch.reveal_deadline:
            raise ValueError(f"challenge {ch.challenge_id.hex()[:16]} has deadlines out of order")
    for name in ("vbonds", "unbonding"):
        stray = set(getattr(state, name)) - set(state.verifiers)
        if stray:
            raise ValueError(f"{name} names account(s) that never bonded as verifiers")


def _int_map(v: Any, name: str) -> dict[str, int]:
    """An account -> non-negative integer map, checked."""
    if not isinstance(v, dict):
        raise ValueError(f"{name} must be a map of account -> integer")
    for k, x in v.items():
        if not isinstance(k, str) or isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= U64:
            raise ValueError(f"{name} must map account ids to integers in 0..{U64}")
    return dict(v)


def _unbonding(v: Any) -> dict[str, list[list[int]]]:
    """account -> [[release_block, amount], ...], checked."""
    if not isinstance(v, dict):
        raise ValueError("unbonding must be a map of account -> [[release_block, amount], ...]")
    out = {}
    for k, rows in v.items():
        if not isinstance(k, str) or not isinstance(rows, list) or len(rows) > MAX_UNBONDING_PER_VERIFIER:
            raise ValueError(
                f"unbonding must map account ids to lists of at most {MAX_UNBONDING_PER_VERIFIER}"
            )
        for row in rows:
            if not (isinstance(row, list) and len(row) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= U64 for x in row)):
                raise ValueError("an unbonding entry is [release_block, amount], integers in 0..2^64 - 1")
        out[k] = [list(r) for r in rows]
    return out


def _optional(v: Any, kind: type, name: str) -> Any:
    if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
        raise ValueError(f"{name} must be {kind.__name__} or null")
    if isinstance(v, int) and not 0 <= v <= U64:
        raise ValueError(f"{name} must be in 0..{U64}")
    return v


def _schedule(rows: Any) -> list[list[Any]]:
    """Scheduled parameter changes, each [effective_block, configured_at, params], checked."""
    if not isinstance(rows, list) or len(rows) > MAX_SCHEDULED_CHANGES:
        raise ValueError(f"schedule must be a list of at most {MAX_SCHEDULED_CHANGES} changes")
    out = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError("a scheduled change is [effective_block, configured_at, params]")
        block, at, params = row
        _int(block, "a scheduled change's effective_block")
        _int(at, "a scheduled change's configured_at")
        out.append([block, at, ProtocolParams.from_dict(params).to_dict()])
    if out != sorted(out, key=lambda x: (x[0], x[1])):
        raise ValueError("schedule is not in effective order")
    return out


def _row(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def dispute_held(state: ProtocolState, account: str) -> int:
    """What the open dispute round's seats of `account` still hold (at most one dispute is open)."""
    return sum(
        ch.held.get(account, 0) for ch in state.challenges.values() if ch.dispute and ch.verdict is None
    )


def free_bond(state: ProtocolState, account: str) -> int:
    """An account's active bond less what its seats (of every round) and escalations hold: what
    it may unbond."""
    return max(
        0, state.vbonds.get(account, 0) - state.reserved.get(account, 0) - dispute_held(state, account)
    )


def open_seats(state: ProtocolState, *, dispute: bool | None = None) -> Counter[str]:
    """account -> its seats on rounds whose penalties are still to come (open, or escalated and
    waiting for their dispute round); `dispute` True or False counts only rounds of that kind.
    One pass over the challenges."""
    out: Counter[str] = Counter()
    for ch in state.challenges.values():
        if (ch.verdict is None or ch.pending) and (dispute is None or ch.dispute == dispute):
            out.update(a for a in ch.committee if ch.held.get(a))
    return out


def dispute_bonds(state: ProtocolState, exclude: str | None = None) -> list[tuple[str, int]]:
    """[(account, the bond a dispute round seats)], in account order: the active bond, but no more
    than keeps the dispute's seats (one penalty each at most) within what the account's escalation
    stakes and its seats on other open rounds leave (an escalator keeps its voice: its stake is
    not taken out of its seats unless its bond could not pay both). A seat of another round and a dispute
    seat may share a unit of bond: their penalties together fit in it (params: two penalties <=
    verifier_stake)."""
    p = state.params
    worst = max(p.no_show_penalty, p.outlier_penalty)
    seats = open_seats(state, dispute=False)
    out = []
    for a, b in sorted(state.vbonds.items()):
        if a == exclude:
            continue
        own = b
        if worst:  # the dispute's seats may be charged at most what stakes and other seats leave
            own = min(
                own, p.verifier_stake * (max(0, b - state.staked.get(a, 0) - worst * seats[a]) // worst)
            )
        out.append((a, own))
    return out


def eligible_verifiers(state: ProtocolState, exclude: str | None = None) -> list[tuple[str, int]]:
    """[(account, free bond)] of the accounts a committee may seat: free bond at least
    verifier_stake (one seat's collateral), the run's miner excluded, in account order.

    The free bond is what `reserved` leaves, but no more seat units than the account's escalation
    room pays one worst penalty each for: the open dispute round's seats hold outside `reserved`
    (a round seat's unit may back one of them), so after penalties have shrunk a bond, its dispute
    seats may already claim what `reserved` shows as free. So every open seat's penalty, the new
    ones included, is paid in full."""
    p = state.params
    floor = p.verifier_stake
    worst = max(p.no_show_penalty, p.outlier_penalty)
    seats = open_seats(state)
    out: list[tuple[str, int]] = []
    for a in state.vbonds:
        if a == exclude:
            continue
        f = state.vbonds[a] - state.reserved.get(a, 0)
        if worst:
            room = state.vbonds[a] - state.staked.get(a, 0) - worst * seats[a]
            f = min(f, floor * (max(0, room) // worst))
        if f >= floor:
            out.append((a, f))
    return sorted(out)


def escalation_room(state: ProtocolState, account: str) -> int:
    """What `account` may still stake on escalations: its active bond less its escalation stakes
    and the most its seats on open rounds (the dispute round's included) can still be penalised,
    one penalty a seat. So every penalty and every forfeited stake is paid in full."""
    p = state.params
    worst = max(p.no_show_penalty, p.outlier_penalty)
    return state.vbonds.get(account, 0) - state.staked.get(account, 0) - worst * open_seats(state)[account]



def new_state(params: ProtocolParams | None = None) -> ProtocolState:
    return ProtocolState(params=params or ProtocolParams())
