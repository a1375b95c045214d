"""The protocol state: runs, challenges, bonds and slashes as plain data (deep-copyable), and its
CBOR snapshot form, so that a follower can restart from a cursor without replaying the chain."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from chain.protocol.params import ProtocolParams
from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import digest

SNAPSHOT_VERSION = "pot/protocol-state/v2"


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
    vbonds: dict[str, int] = field(default_factory=dict)  # verifier -> active bond (committee weight)
    unbonding: dict[str, list[list[int]]] = field(default_factory=dict)  # verifier -> [[release_block, amount]]
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
            "unbonding": {k: [list(x) for x in v] for k, v in self.unbonding.items()},
            "authority": self.authority,
            "configured_at": self.configured_at,
            "schedule": [list(x) for x in self.schedule],
        })

    @classmethod
    def from_cbor(cls, data: bytes) -> ProtocolState:
        try:
            obj = cbor.decode(data)
            version = obj.get("version") if isinstance(obj, dict) else None
            if isinstance(version, str) and version.startswith("pot/protocol-state/") and version != SNAPSHOT_VERSION:
                raise ValueError(f"a {version} snapshot, of another protocol version; this node reads "
                                 f"{SNAPSHOT_VERSION}: derive the state again from the chain (drop the snapshot)")
            if version != SNAPSHOT_VERSION:
                raise ValueError(f"not a {SNAPSHOT_VERSION} snapshot")
            runs = [RunState(**r) for r in obj["runs"]]
            for r in runs:  # snapshots of older nodes kept the whole encoded registration
                if len(r.registration) != 32:
                    r.registration = registration_digest(r.registration)
            challenges = [ChallengeState(**c) for c in obj["challenges"]]
            return cls(
                params=ProtocolParams.from_dict(obj["params"]),
                head=obj["head"],
                runs={r.run_id: r for r in runs},
                challenges={c.challenge_id: c for c in challenges},
                bonds=dict(obj["bonds"]),
                slashed=dict(obj["slashed"]),
                verifiers=list(obj["verifiers"]),
                vbonds=_int_map(obj["vbonds"], "vbonds"),
                unbonding=_unbonding(obj["unbonding"]),
                # Snapshots of nodes older than the network record have none of these.
                authority=_optional(obj.get("authority"), str, "authority"),
                configured_at=_optional(obj.get("configured_at"), int, "configured_at"),
                schedule=_schedule(obj.get("schedule", [])),
            )
        except (AttributeError, CommitmentError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"protocol state snapshot is unusable: {exc}") from None


class SnapshotError(ValueError):
    """A persisted protocol state that cannot be restored, with the reason."""


def registration_digest(encoded: bytes) -> bytes:
    """What a run keeps of its registration: enough to know an identical repeat, 32 bytes
    whatever the spec's size."""
    return digest("pot/registration/v1", bytes(encoded))


def _int_map(v: Any, name: str) -> dict[str, int]:
    """An account -> non-negative integer map, checked."""
    if not isinstance(v, dict):
        raise ValueError(f"{name} must be a map of account -> integer")
    for k, x in v.items():
        if not isinstance(k, str) or isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"{name} must map account ids to non-negative integers")
    return dict(v)


def _unbonding(v: Any) -> dict[str, list[list[int]]]:
    """account -> [[release_block, amount], ...], checked."""
    if not isinstance(v, dict):
        raise ValueError("unbonding must be a map of account -> [[release_block, amount], ...]")
    out = {}
    for k, rows in v.items():
        if not isinstance(k, str) or not isinstance(rows, list):
            raise ValueError("unbonding must map account ids to lists")
        for row in rows:
            if not (isinstance(row, list) and len(row) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row)):
                raise ValueError("an unbonding entry is [release_block, amount], non-negative integers")
        out[k] = [list(r) for r in rows]
    return out


def _optional(v: Any, kind: type, name: str) -> Any:
    if v is not None and (not isinstance(v, kind) or isinstance(v, bool)):
        raise ValueError(f"{name} must be {kind.__name__} or null")
    return v


def _schedule(rows: Any) -> list[list[Any]]:
    """Scheduled parameter changes, each [effective_block, configured_at, params], checked."""
    if not isinstance(rows, list):
        raise ValueError("schedule must be a list")
    out = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError("a scheduled change is [effective_block, configured_at, params]")
        block, at, params = row
        if any(not isinstance(v, int) or isinstance(v, bool) for v in (block, at)):
            raise ValueError("a scheduled change's blocks must be integers")
        out.append([block, at, ProtocolParams.from_dict(params).to_dict()])
    return out


def _row(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def eligible_verifiers(state: ProtocolState, exclude: str | None = None) -> list[tuple[str, int]]:
    """[(account, active bond)] of the accounts a committee may seat: active bond at least
    verifier_stake, the run's miner excluded, in account order."""
    floor = state.params.verifier_stake
    return sorted((a, b) for a, b in state.vbonds.items() if b >= floor and a != exclude)



def new_state(params: ProtocolParams | None = None) -> ProtocolState:
    return ProtocolState(params=params or ProtocolParams())
