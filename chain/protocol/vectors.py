"""Conformance vectors: scenarios of the protocol state machine, written as data that every
transport and any outside client must reproduce.

A case (`@case("name")`) is a short function that builds a scenario on a `Scenario`: blocks of
(origin, call), one after another, from an empty state. Run on the in-memory `PureBackend` (block
hashes from a fixed domain), each block gets `on_block` then `apply_recorded` for each call, in
order, and the generator writes one JSON file per case under `vectors/protocol/<version>/` (the
version is the last part of `state.SNAPSHOT_VERSION`) plus a `manifest.json`:

  * `params`: the parameter record (`ProtocolParams.to_dict()`) and `params_cbor`, its canonical
    CBOR (hex); the state starts as `new_state(params)`, with no authority;
  * `blocks`: for each block its `number`, `hash` (hex), `calls` as [origin, wire hex of
    `encode_call`], the `events` the block produced (`Event.to_dict()`: the type name under
    "event", the fields, bytes as hex) and `state_digest`, the digest of the post-state snapshot;
  * `final_state`: the hex of the last post-state's `to_cbor()`.

A state digest is `commitments.hashing.digest(STATE_DIGEST_DOMAIN, snapshot_bytes)`, that is
BLAKE3-256 of the canonical CBOR array [domain, snapshot bytes]. A case is `hash_independent` when
generating it with other block hashes gives the same events (no challenge is drawn).

`python -m chain.protocol.vectors write [dir]` writes the files; `check [dir]` says which differ
from a fresh generation (exit status 1). Generation is deterministic: regenerating is
byte-identical. It fails if any refusal code of `refusals.py` is reached by no case and is not
listed, with its reason, in `UNREACHABLE`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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
    encode_call,
)
from chain.protocol.events import EVENT_TYPES, CallRefused, ChallengeIssued, Event
from chain.protocol.params import (
    MAX_BLOCK,
    MAX_BOND,
    MAX_ENDPOINT_BYTES,
    MAX_UNBONDING_PER_VERIFIER,
    ProtocolParams,
)
from chain.protocol.refusals import REFUSAL_TYPES
from chain.protocol.rules import apply_recorded, on_block
from chain.protocol.state import SNAPSHOT_VERSION, ProtocolState, new_state
from challenges.refused import REFUSED_BUCKET, refused_value_hash
from challenges.witness import witness_commitment
from commitments import cbor, merkle
from commitments.hashing import digest
from commitments.leaves import step_leaf, witness_value_hash
from commitments.spec import Spec

VERSION = SNAPSHOT_VERSION.rsplit("/", 1)[-1]
ROOT = Path(__file__).resolve().parents[2] / "vectors" / "protocol"
DEFAULT_DIR = ROOT / VERSION
FORMAT = "pot/protocol-vectors/v1"
STATE_DIGEST_DOMAIN = "pot/protocol-vectors/state/v1"
BLOCK_HASH_DOMAIN = "pot/protocol-vectors/block/v1"
# Generating a case again with block hashes of this domain tells whether its events depend on them.
OTHER_HASH_DOMAIN = "pot/protocol-vectors/other-block/v1"
ACCOUNTS = ("miner", "v1", "v2", "v3", "v4", "v5")

# Small windows keep the vectors short; four verifiers fit in one committee, so no draw below the
# dispute round leaves a bonded verifier out.
VECTOR_PARAMS = ProtocolParams(
    commit_window=4, reveal_window=4, opening_deadline=4, challenges_per_run=1, challenge_delay=2,
    quorum_min_reveals=3, miner_stake=1000, verifier_stake=100, slash_amount=500, committee_size=5,
    max_rounds=3, no_show_penalty=50, outlier_penalty=50, unbonding_delay=6,
)

# Refusal codes no call can reach, each with the reason. Everything else must be reached by a case.
UNREACHABLE = {
    "Refused": "the base class: the rules raise only its subclasses",
    "UnknownCall": "raised for an object that is no protocol call; every decoded payload is one",
    "ProtocolError": "recorded by a follower when applying a call crashed; the rules never raise it",
}


class VectorError(RuntimeError):
    """A case that cannot be built or a vector set that is incomplete; the message says which."""


def state_digest(state: ProtocolState) -> bytes:
    return digest(STATE_DIGEST_DOMAIN, state.to_cbor())


def block_hash(domain: str, case_name: str, number: int) -> bytes:
    return digest(domain, case_name, number)


@dataclass(frozen=True)
class VectorBlock:
    """A block as the rules see it (chain.transport.Block has the same fields, and more)."""

    number: int
    hash: bytes
    calls: tuple[tuple[str, Call], ...] = ()


# --- synthetic runs ----------------------------------------------------------------------------


@dataclass
class SyntheticRun:
    """A run of made-up state digests with real step leaves, roots and proofs: what the protocol
    checks of a run (Merkle proofs, the leaf format, H(leaf t)) is exactly what it checks here."""

    steps: int = 8
    seed: str = "run-a"
    profile: str = "exact-v1"
    endpoint: str = "http://miner.test:8000"
    miner: str = "miner"  # the account that registers it: the run id is derived from it
    leaves: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.leaves = [
            step_leaf(t, digest("pot/test/state/v1", self.seed, t), 0 if t == 0 else 0x40000000 + t)
            for t in range(self.steps + 1)
        ]

    @property
    def spec(self) -> Spec:
        kw: dict[str, Any] = {"steps": self.steps, "profile": self.profile}
        if self.profile != "exact-v1":
            kw["hardware"] = {"device": "cuda", "isa": "sm90", "threads": 1}
        return Spec.from_dict(kw)

    @property
    def nonce(self) -> bytes:
        return digest("pot/test/run-nonce/v1", self.seed)[:16]

    @property
    def run_id(self) -> bytes:
        return derive_run_id(self.miner, self.nonce)

    def register(self, **overrides: Any) -> StartTrainingCommitment:
        fields_: dict[str, Any] = {
            "run_id": self.run_id, "nonce": self.nonce,
            "initial_hash": digest("pot/test/state/v1", self.seed, 0),
            "schedule_commitment": digest("pot/test/schedule/v1", self.seed),
            "dataset_hash": digest("pot/test/dataset/v1", self.seed),
            "spec": self.spec.to_cbor(), "declared_steps": self.steps, "endpoint": self.endpoint,
        }
        fields_.update(overrides)
        return StartTrainingCommitment(**fields_)

    def root(self, size: int) -> bytes:
        return merkle.root(self.leaves[:size])

    def submit_root(self, size: int, old_size: int = 0) -> SubmitCheckpointRoot:
        proof = merkle.consistency_proof(self.leaves[:size], old_size) if old_size else []
        return SubmitCheckpointRoot(self.run_id, self.root(size), size, tuple(proof))

    def submit_full_root(self) -> SubmitCheckpointRoot:
        return self.submit_root(self.steps + 1)

    def opening(self, challenge_id: bytes, step: int, *, uri: str | None = None,
                leaf: bytes | None = None) -> SubmitOpening:
        return SubmitOpening(
            challenge_id, digest("pot/test/opening/v1", challenge_id),
            uri if uri is not None else f"{self.endpoint}/openings/{challenge_id.hex()}",
            leaf if leaf is not None else self.leaves[step], tuple(merkle.inclusion_proof(self.leaves, step)))

    def value_hash(self, step: int) -> bytes:
        return witness_value_hash(self.leaves[step])


def honest_proof(challenge_id: bytes) -> bytes:
    """The proof half every honest replayer of a synthetic run reveals (it has no tensors)."""
    return digest("pot/test/proof/v1", challenge_id)


# --- scenarios and backends --------------------------------------------------------------------


class Backend(Protocol):
    """Where a scenario's blocks are made: in memory (`PureBackend`) or on a transport (tests)."""

    @property
    def state(self) -> ProtocolState: ...

    @property
    def head(self) -> int: ...

    @property
    def events(self) -> list[Event]: ...

    def block(self, calls: list[tuple[str, Call]]) -> list[Event]:
        """Make the block after `head` holding `calls` [(origin, call)]; return its events."""
        ...


class PureBackend:
    """Blocks made in memory, numbered from `start`, hashes digest(hash_domain, case, number)."""

    def __init__(self, params: ProtocolParams, case_name: str, *, hash_domain: str = BLOCK_HASH_DOMAIN,
                 start: int = 1) -> None:
        self.state = new_state(params)
        self.case_name, self.hash_domain = case_name, hash_domain
        self.head = start - 1
        self.events: list[Event] = []
        self.blocks: list[dict[str, Any]] = []

    def block(self, calls: list[tuple[str, Call]]) -> list[Event]:
        n = self.head + 1
        blk = VectorBlock(n, block_hash(self.hash_domain, self.case_name, n), tuple(calls))
        out = on_block(self.state, blk)
        for origin, call in calls:
            out += apply_recorded(self.state, call, origin, blk)
        self.head = n
        self.events += out
        self.blocks.append({
            "number": n, "hash": blk.hash.hex(),
            "calls": [[origin, encode_call(call).hex()] for origin, call in calls],
            "events": [e.to_dict() for e in out],
            "state_digest": state_digest(self.state).hex(),
        })
        return out


class Scenario:
    """What a case writes on: blocks of calls by named accounts, and what the state says so far.

    Account names (ACCOUNTS) map to the origins of the backend's chain (the names themselves in
    the vectors; a transport's account ids when a test replays a case on one)."""

    def __init__(self, backend: Backend, accounts: Mapping[str, str] | None = None) -> None:
        self.backend = backend
        self.accounts = dict(accounts) if accounts is not None else {a: a for a in ACCOUNTS}

    def account(self, name: str) -> str:
        try:
            return self.accounts[name]
        except KeyError:
            raise VectorError(f"no account {name!r}; accounts are {', '.join(self.accounts)}") from None

    @property
    def state(self) -> ProtocolState:
        return self.backend.state

    @property
    def head(self) -> int:
        return self.backend.head

    @property
    def params(self) -> ProtocolParams:
        return self.backend.state.params

    def run(self, seed: str = "run-a", **kw: Any) -> SyntheticRun:
        return SyntheticRun(miner=self.account("miner"), seed=seed, **kw)

    # blocks
    def block(self, *calls: tuple[str, Call]) -> list[Event]:
        """One block holding calls by named accounts, in order."""
        return self.backend.block([(self.account(name), call) for name, call in calls])

    def by(self, name: str, *calls: Call) -> list[Event]:
        """One block holding `calls`, all by `name` (one transaction on a transport)."""
        return self.block(*((name, c) for c in calls))

    def empty(self, count: int = 1) -> None:
        for _ in range(count):
            self.backend.block([])

    def advance_to(self, number: int) -> None:
        """Empty blocks until block `number` is made."""
        while self.head < number:
            self.backend.block([])

    # what happened
    def issued(self, index: int = -1) -> ChallengeIssued:
        found = [e for e in self.backend.events if isinstance(e, ChallengeIssued)]
        if not found:
            raise VectorError("no challenge has been issued")
        return found[index]

    # common steps
    def bond(self, *names: str, amount: int | None = None) -> None:
        for name in names:
            self.by(name, BondVerifier(amount if amount is not None else self.params.verifier_stake))

    def challenge(self, run: SyntheticRun, verifiers: Iterable[str] = ("v1", "v2", "v3")) -> ChallengeIssued:
        """Bond `verifiers`, register `run`, submit its full root, wait for its challenge."""
        self.bond(*verifiers)
        self.by("miner", run.register())
        self.by("miner", run.submit_full_root())
        at = self.state.runs[run.run_id].challenges_at
        assert at is not None
        self.advance_to(at)
        return self.issued()

    def witness(
        self,
        ch: ChallengeIssued,
        name: str,
        value_hash: bytes,
        bucket: int = 0,
        proof_hash: bytes | None = None,
        salt: bytes | None = None,
    ) -> tuple[CommitWitness, RevealWitnessValue]:
        """The (commit, reveal) pair of account `name` for a challenge."""
        origin = self.account(name)
        salt = salt if salt is not None else digest("pot/test/salt/v1", ch.challenge_id, name)
        p = honest_proof(ch.challenge_id) if proof_hash is None else proof_hash
        com = witness_commitment(ch.challenge_id, value_hash, bucket, salt, origin, proof_hash=p)
        return CommitWitness(ch.challenge_id, com), RevealWitnessValue(
            ch.challenge_id, value_hash, p, bucket, salt
        )

    def witnesses(
        self, ch: ChallengeIssued, values: Mapping[str, bytes], buckets: Mapping[str, int] | None = None
    ) -> None:
        """Each named account commits to its value, then reveals it once the commit window closes."""
        pairs = {n: self.witness(ch, n, v, (buckets or {}).get(n, 0)) for n, v in values.items()}
        for n, (com, _) in pairs.items():
            self.by(n, com)
        self.advance_to(ch.commit_deadline)
        for n, (_, rev) in pairs.items():
            self.by(n, rev)

    def resolve(self, ch: ChallengeIssued) -> None:
        """Empty blocks until the round resolves: the block after its escalation window."""
        self.advance_to(ch.escalate_deadline + 1)


# --- the cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Scenario], None]
    doc: str
    params: ProtocolParams
    transport: bool  # replayed through the transports by tests/chain/test_vectors.py


CASES: dict[str, Case] = {}


def case(name: str, *, params: Mapping[str, Any] | None = None,
         transport: bool = False) -> Callable[[Callable[[Scenario], None]], Callable[[Scenario], None]]:
    """Register a case: `params` override VECTOR_PARAMS; `transport` marks it for the transport
    tests (its blocks must each hold calls of one account)."""

    def register(build: Callable[[Scenario], None]) -> Callable[[Scenario], None]:
        if name in CASES:
            raise VectorError(f"case {name!r} is defined twice")
        merged = {**VECTOR_PARAMS.to_dict(), **(params or {})}
        doc = " ".join((build.__doc__ or "").split())
        CASES[name] = Case(name, build, doc, ProtocolParams.from_dict(merged), transport)
        return build

    return register


def H(*parts: Any) -> bytes:  # noqa: N802 - a made-up 32-byte value
    return digest("pot/test/vector/v1", *parts)


@case("bond_unbond_release", transport=True)
def _bond_unbond_release(s: Scenario) -> None:
    """A first bond, a top-up, a partial unbond, the rest unbonded, their releases after
    unbonding_delay, and the emptied account leaving the registry."""
    s.by("v1", BondVerifier(100))
    s.by("v1", BondVerifier(50))
    s.by("v1", UnbondVerifier(50))
    s.by("v1", UnbondVerifier(100))
    s.advance_to(s.head + s.params.unbonding_delay)


@case("bond_refusals", transport=True)
def _bond_refusals(s: Scenario) -> None:
    """Unbonding without a bond, a first bond below verifier_stake, an unbond over the bond, one that
    would leave less than verifier_stake, and more waiting amounts than the cap."""
    s.by("v1", UnbondVerifier(10))
    s.by("v1", BondVerifier(99))
    s.by("v1", BondVerifier(100))
    s.by("v1", UnbondVerifier(101))
    s.by("v1", UnbondVerifier(50))
    s.by("v1", BondVerifier(1000))
    s.by("v1", *[UnbondVerifier(1) for _ in range(MAX_UNBONDING_PER_VERIFIER + 1)])


@case("bond_over_cap")
def _bond_over_cap(s: Scenario) -> None:
    """A bond past MAX_BOND is refused (FieldTooLarge)."""
    s.by("v1", BondVerifier(MAX_BOND))
    s.by("v1", BondVerifier(1))


@case("registration", transport=True)
def _registration(s: Scenario) -> None:
    """A registration, its identical repeat (a no-op), a conflicting one, one by another account,
    one copied by another account, and contents the protocol cannot use or keep."""
    run = s.run()
    s.by("miner", run.register())
    s.by("miner", run.register())
    s.by("miner", run.register(endpoint="http://other.test:1"))
    s.by("v1", run.register())
    s.by("v1", s.run(seed="run-b").register())
    bad = s.run(seed="run-c")
    s.by("miner", bad.register(declared_steps=bad.steps + 1))
    s.by("miner", bad.register(endpoint="http://" + "e" * MAX_ENDPOINT_BYTES))


@case("registration_window_and_escrow_limits")
def _registration_limits(s: Scenario) -> None:
    """A checkpoint interval whose regeneration cannot fit an opening window, and a registration
    whose verification escrow would pass the cap on one amount."""
    s.by("miner", s.run().register(checkpoint_interval=10**12))
    s.by("miner", s.run(seed="run-b").register(checkpoint_interval=4))


@case("registration_escrow_too_large", params={"fee_per_replay_block": 1 << 48})
def _registration_escrow(s: Scenario) -> None:
    """The escrow (seat fee x seats below the dispute round x challenges) is over MAX_BOND."""
    s.by("miner", s.run().register())


@case("registration_replay_too_slow", params={"reference_flops": 1, "max_replay_blocks": 10})
def _registration_replay_too_slow(s: Scenario) -> None:
    """A spec whose replay cannot fit in max_replay_blocks at the reference speed."""
    s.by("miner", s.run().register())


@case("roots", transport=True)
def _roots(s: Scenario) -> None:
    """Roots that grow by consistency proofs up to the complete root, and the refusals of roots."""
    run = s.run()
    s.by("miner", SubmitCheckpointRoot(run.run_id, run.root(3), 3, ()))
    s.by("miner", run.register())
    s.by("miner", SubmitCheckpointRoot(run.run_id, run.root(3), 3, (H("proof"),)))
    s.by("miner", SubmitCheckpointRoot(run.run_id, run.root(1), 0, ()))
    s.by("miner", run.submit_root(3))
    s.by("miner", run.submit_root(3))
    s.by("v1", run.submit_root(6, 3))
    s.by("miner", SubmitCheckpointRoot(run.run_id, run.root(6), 6, (H("proof"),)))
    s.by("miner", SubmitCheckpointRoot(run.run_id, run.root(2), 2, ()))
    s.by("miner", SubmitCheckpointRoot(run.run_id, H("other"), 3, ()))
    s.by("miner", run.submit_root(6, 3))
    s.by("miner", run.submit_root(9, 6))


@case("calls_on_unknown_challenges", transport=True)
def _calls_on_unknown_challenges(s: Scenario) -> None:
    """Every challenge call naming a challenge that does not exist."""
    cid = H("no challenge")
    s.by("miner", SubmitOpening(cid, H("opening"), "http://miner.test/o", b"leaf", ()))
    s.by("miner", DeclareWitnessNormBucket(cid, 3))
    s.by("v1", CommitWitness(cid, H("commitment")))
    s.by("v1", RevealWitnessValue(cid, H("value"), H("proof"), 0, bytes(16)))


@case("configure_network", transport=True)
def _configure_network(s: Scenario) -> None:
    """A parameter record names the authority and takes effect at its block; records by another
    account, for a past block, out of range or unusable are refused."""
    later = ProtocolParams.from_dict({**s.params.to_dict(), "reveal_window": 6})
    s.by("miner", ConfigureNetwork(later.to_cbor(), s.head + 3))
    s.by("v1", ConfigureNetwork(later.to_cbor(), s.head + 5))
    s.by("miner", ConfigureNetwork(later.to_cbor(), s.head))
    s.by("miner", ConfigureNetwork(later.to_cbor(), MAX_BLOCK + 1))
    s.by("miner", ConfigureNetwork(cbor.encode({**later.to_dict(), "commit_window": 0}), s.head + 5))
    s.by("miner", ConfigureNetwork(b"\xa0", s.head + 5))
    s.empty(2)


@case("honest_with_outlier_and_no_shows", params={"commit_window": 16, "reveal_window": 8})
def _honest(s: Scenario) -> None:
    """Issuance, an opening, commits and reveals: an honest verdict, an outlier's penalty, the
    penalty of a member that commits and never reveals, and the refusals of witness calls."""
    run = s.run()
    ch = s.challenge(run, ("v1", "v2", "v3", "v4"))
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    s.by("miner", run.opening(ch.challenge_id, ch.step))  # the same opening again: a no-op
    s.by("miner", run.opening(ch.challenge_id, ch.step, uri="http://elsewhere.test/o"))
    s.by("miner", DeclareWitnessNormBucket(ch.challenge_id, 1))
    good = run.value_hash(ch.step)
    pairs = {n: s.witness(ch, n, v) for n, v in (("v1", good), ("v2", good), ("v3", H("noise")))}
    s.by("miner", s.witness(ch, "miner", good)[0])
    s.by("v1", pairs["v1"][0])
    s.by("v1", s.witness(ch, "v1", H("other"))[0])
    s.by("v1", pairs["v1"][1])
    s.by("v2", pairs["v2"][0])
    s.by("v3", pairs["v3"][0])
    s.by("v4", s.witness(ch, "v4", good)[0])
    s.by("v2", pairs["v2"][1])  # still inside the commit window
    s.advance_to(ch.commit_deadline)
    s.by("v3", pairs["v3"][0])  # the window is closed
    s.by("v1", pairs["v1"][1])
    s.by("v1", pairs["v1"][1])  # the same reveal again: a no-op
    s.by("v2", s.witness(ch, "v2", H("forged"))[1])  # does not open v2's commitment
    s.by("v2", pairs["v2"][1])
    s.by("v3", pairs["v3"][1])
    s.advance_to(ch.reveal_deadline)
    s.by("v4", s.witness(ch, "v4", good)[1])  # after the reveal window
    s.resolve(ch)


@case("outsider_and_late_reveal")
def _outsider(s: Scenario) -> None:
    """An account off the committee cannot commit; one that never committed cannot reveal; a
    committee member that never commits pays the no-show penalty."""
    run = s.run()
    ch = s.challenge(run)
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    s.by("v4", s.witness(ch, "v4", run.value_hash(ch.step))[0])
    good = run.value_hash(ch.step)
    s.witnesses(ch, {"v1": good, "v2": good})
    s.advance_to(ch.commit_deadline + 1)
    s.by("v3", s.witness(ch, "v3", good)[1])
    s.resolve(ch)


@case("fraud_slashes_the_miner")
def _fraud(s: Scenario) -> None:
    """Verifiers agree on a value other than the opened leaf's: fraud, and the miner's slash."""
    run = s.run()
    ch = s.challenge(run)
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    replayed = H("honest replay", ch.step)
    s.witnesses(ch, {"v1": replayed, "v2": replayed, "v3": replayed})
    s.resolve(ch)


@case("missing_opening")
def _missing_opening(s: Scenario) -> None:
    """No opening by the deadline is fraud; the challenge is closed to commitments and openings."""
    run = s.run()
    ch = s.challenge(run)
    s.advance_to(ch.opening_deadline + 1)
    s.by("v1", s.witness(ch, "v1", run.value_hash(ch.step))[0])
    s.by("miner", run.opening(ch.challenge_id, ch.step))


@case("bad_openings", params={"forced_challenge_steps": [3]})
def _bad_openings(s: Scenario) -> None:
    """An opening whose leaf proof fails, and one whose leaf is not the challenged step's."""
    run = s.run()
    run.leaves[3] = step_leaf(4, digest("pot/test/state/v1", run.seed, 4), 0x40000004)  # a leaf naming step 4
    ch = s.challenge(run)
    s.by("miner", run.opening(ch.challenge_id, ch.step, leaf=run.leaves[2]))
    s.by("miner", run.opening(ch.challenge_id, ch.step))


@case("rechallenge_to_dispute")
def _rechallenge(s: Scenario) -> None:
    """Tied rounds re-challenge the step with longer windows up to the dispute round, where the
    largest cluster decides."""
    run = s.run()
    ch = s.challenge(run, ("v1", "v2", "v3", "v4"))
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    good = run.value_hash(ch.step)
    s.witnesses(ch, {"v1": good, "v2": good, "v3": H("a"), "v4": H("a")})
    s.resolve(ch)
    ch2 = s.issued()
    s.by("miner", run.opening(ch2.challenge_id, ch2.step))
    s.witnesses(ch2, {"v1": good, "v2": good, "v3": H("a"), "v4": H("a")})
    s.resolve(ch2)
    ch3 = s.issued()
    s.by("miner", run.opening(ch3.challenge_id, ch3.step))
    s.witnesses(ch3, {"v1": good, "v2": good, "v3": good, "v4": H("a")})
    s.resolve(ch3)


@case("refused_opening_reopens")
def _refused(s: Scenario) -> None:
    """A committee that refuses the opening gives the miner a second window; refused again, fraud."""
    run = s.run()
    ch = s.challenge(run)
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    s.witnesses(ch, {v: refused_value_hash(ch.challenge_id) for v in ("v1", "v2", "v3")})
    s.resolve(ch)
    ch2 = s.issued()
    s.by("miner", run.opening(ch2.challenge_id, ch2.step))
    s.witnesses(ch2, {v: refused_value_hash(ch2.challenge_id) for v in ("v1", "v2", "v3")})
    s.resolve(ch2)


@case("commit_before_the_opening")
def _commit_early(s: Scenario) -> None:
    """A seat cannot commit before the opening is on chain (there is nothing to replay); once it is,
    the seat commits, and a reserved bond cannot be unbonded while the round holds it."""
    run = s.run()
    ch = s.challenge(run)
    good = run.value_hash(ch.step)
    s.by("v1", s.witness(ch, "v1", good)[0])
    s.by("v1", UnbondVerifier(100))
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    s.witnesses(ch, {"v1": good, "v2": good, "v3": good})
    s.resolve(ch)


@case("escalation_to_the_dispute_round", params={"committee_size": 3, "escalation_stake": 100})
def _escalation(s: Scenario) -> None:
    """A lazy majority of a round shares one made-up value; the one honest seat escalates (staking
    escalation_stake), the dispute round seats the rest of the network, which replays: honest. The
    lazy seats pay outlier_penalty, the escalator gets its stake back, and the escalation's refusals."""
    run = s.run()
    ch = s.challenge(run)
    s.bond("v4", "v5", amount=300)
    s.by("v3", BondVerifier(100))  # free bond for the escalation stake
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    good, made_up = run.value_hash(ch.step), H("made-up")
    pairs = {"v1": s.witness(ch, "v1", made_up, proof_hash=H("made-up proof")),
             "v2": s.witness(ch, "v2", made_up, proof_hash=H("made-up proof")),
             "v3": s.witness(ch, "v3", good)}
    for n, (com, _) in pairs.items():
        s.by(n, com)
    s.advance_to(ch.commit_deadline)
    s.by("v3", EscalateChallenge(ch.challenge_id))  # too early: reveals are still open
    for n, (_, rev) in pairs.items():
        s.by(n, rev)
    s.advance_to(ch.reveal_deadline)
    esc = EscalateChallenge(ch.challenge_id)
    # v1 agrees with the winning cluster, v4 revealed nothing on this round; v3's second is a no-op
    s.block(("v1", esc), ("v4", esc), ("v3", esc), ("v3", esc))
    s.resolve(ch)
    dispute = s.issued()
    s.by("v4", EscalateChallenge(dispute.challenge_id))  # the dispute round is the last word
    s.by("miner", run.opening(dispute.challenge_id, dispute.step))
    s.witnesses(dispute, {"v4": good, "v5": good})
    s.resolve(dispute)


@case("escalation_without_free_bond", params={"committee_size": 3})
def _escalation_unaffordable(s: Scenario) -> None:
    """A dissenting seat whose free bond is below escalation_stake cannot escalate, and the round
    resolves as its clusters say."""
    run = s.run()
    ch = s.challenge(run)
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    good = run.value_hash(ch.step)
    s.witnesses(ch, {"v1": good, "v2": good, "v3": H("noise")})
    s.advance_to(ch.reveal_deadline + 1)
    s.by("v3", EscalateChallenge(ch.challenge_id))
    s.resolve(ch)
    s.by("v3", EscalateChallenge(ch.challenge_id))  # the window is closed


@case("dispute_refusal_share_is_fraud", params={"max_rounds": 1})
def _dispute_refusals(s: Scenario) -> None:
    """In a dispute round, refused seats holding dispute_refusal_share of the revealed seats make the
    step fraud: the miner served half the seats, the others reported the refusal."""
    run = s.run()
    ch = s.challenge(run, ("v1", "v2", "v3", "v4"))
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    good, refused = run.value_hash(ch.step), refused_value_hash(ch.challenge_id)
    s.witnesses(ch, {"v1": good, "v2": good, "v3": refused, "v4": refused})
    s.resolve(ch)


@case("dispute_tie_is_unresolved", params={"max_rounds": 1})
def _dispute_tie(s: Scenario) -> None:
    """A dispute round whose two largest served clusters tie leaves the step unresolved: the miner's
    stake stays locked and the run's escrow is burned."""
    run = s.run()
    ch = s.challenge(run, ("v1", "v2", "v3", "v4"))
    s.by("miner", run.opening(ch.challenge_id, ch.step))
    good = run.value_hash(ch.step)
    s.witnesses(ch, {"v1": good, "v2": good, "v3": H("a"), "v4": H("a")})
    s.resolve(ch)


@case("cross_architecture_buckets", params={"committee_size": 15})
def _buckets(s: Scenario) -> None:
    """A bucket-profile run: the miner declares its norm bucket, verifiers reveal buckets; a
    different declaration and a late one are refused, and so is a declaration on an exact run."""
    run = s.run(profile="torch-native")
    exact = s.run(seed="run-exact")
    s.bond("v1", "v2", "v3", amount=1000)  # 30 seat units: both runs' committees of 15 at once
    s.by("miner", exact.register())
    s.by("miner", run.register())
    s.by("miner", exact.submit_full_root())
    s.by("miner", run.submit_full_root())
    s.advance_to(s.state.runs[run.run_id].challenges_at or 0)
    by_run = {e.run_id: e for e in s.backend.events if isinstance(e, ChallengeIssued)}
    ch, ex = by_run[run.run_id], by_run[exact.run_id]
    s.by("miner", run.opening(ch.challenge_id, ch.step), DeclareWitnessNormBucket(ch.challenge_id, 7))
    s.by("miner", DeclareWitnessNormBucket(ch.challenge_id, 7))
    s.by("miner", DeclareWitnessNormBucket(ch.challenge_id, 8))
    s.by("miner", DeclareWitnessNormBucket(ex.challenge_id, 7))
    value = run.value_hash(ch.step)
    s.witnesses(ch, {"v1": value, "v2": value, "v3": value}, {"v1": 7, "v2": 7, "v3": REFUSED_BUCKET})
    s.by("miner", DeclareWitnessNormBucket(ch.challenge_id, 7))
    s.resolve(ch)


@case("one_block_many_origins")
def _one_block(s: Scenario) -> None:
    """Calls of several accounts in one block apply in chain order: a bond and an unbond by the
    same account in one block, and a miner's registration and root in one transaction."""
    run = s.run()
    s.block(("v1", BondVerifier(100)), ("v2", UnbondVerifier(1)), ("v1", UnbondVerifier(100)),
            ("miner", run.register()), ("miner", run.submit_root(9)))


def _check_case(name: str) -> Case:
    try:
        return CASES[name]
    except KeyError:
        raise VectorError(f"no case {name!r}; cases are {', '.join(sorted(CASES))}") from None


def build(name: str, backend: Backend, accounts: Mapping[str, str] | None = None) -> Scenario:
    """Run case `name` on a backend (whose state starts from the case's params)."""
    c = _check_case(name)
    s = Scenario(backend, accounts)
    c.build(s)
    return s


def generate(name: str) -> dict[str, Any]:
    """The vector of one case, as the JSON object its file holds."""
    c = _check_case(name)
    pure = PureBackend(c.params, name)
    build(name, pure)
    other = PureBackend(c.params, name, hash_domain=OTHER_HASH_DOMAIN)
    build(name, other)
    hash_independent = [b["events"] for b in pure.blocks] == [b["events"] for b in other.blocks]
    refusals = sorted({e.refusal for e in pure.events if isinstance(e, CallRefused)})
    return {
        "format": FORMAT,
        "protocol": SNAPSHOT_VERSION,
        "case": name,
        "doc": c.doc,
        "hash_independent": hash_independent,
        "transport": c.transport,
        "params": c.params.to_dict(),
        "params_cbor": c.params.to_cbor().hex(),
        "state_digest_domain": STATE_DIGEST_DOMAIN,
        "blocks": pure.blocks,
        "final_state": pure.state.to_cbor().hex(),
        "refusals": refusals,
        "event_types": sorted({e.code for e in pure.events}),
    }


def encode_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def coverage(vectors: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """refusal code -> the cases that reach it, for every code of REFUSAL_TYPES."""
    return {
        code: sorted(n for n, v in vectors.items() if code in v["refusals"]) for code in sorted(REFUSAL_TYPES)
    }


def missing_refusals(vectors: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Refusal codes no case reaches and UNREACHABLE does not explain (should be none)."""
    stray = sorted(set(UNREACHABLE) - set(REFUSAL_TYPES))
    if stray:
        raise VectorError(f"UNREACHABLE names codes refusals.py does not have: {', '.join(stray)}")
    return [code for code, cases in coverage(vectors).items() if not cases and code not in UNREACHABLE]


def generate_all() -> dict[str, bytes]:
    """file name -> bytes of every vector file and the manifest. Fails when a refusal is uncovered."""
    vectors = {name: generate(name) for name in sorted(CASES)}
    missing = missing_refusals(vectors)
    if missing:
        raise VectorError(f"no case reaches the refusal code(s) {', '.join(missing)}: add a case, or list "
                          "the code in UNREACHABLE with the reason no call can reach it")
    files = {f"{name}.json": encode_json(v) for name, v in vectors.items()}
    manifest = {
        "format": FORMAT,
        "protocol": SNAPSHOT_VERSION,
        "state_digest_domain": STATE_DIGEST_DOMAIN,
        "file_digest": "BLAKE3-256 of the file's bytes (commitments.hashing.h)",
        "cases": {name: {"file": f"{name}.json", "digest": _file_digest(files[f"{name}.json"]),
                         "final_state_digest": v["blocks"][-1]["state_digest"] if v["blocks"] else None,
                         "hash_independent": v["hash_independent"], "transport": v["transport"],
                         "blocks": len(v["blocks"])}
                  for name, v in vectors.items()},
        "refusals": coverage(vectors),
        "unreachable": dict(sorted(UNREACHABLE.items())),
        "events": {code: sorted(n for n, v in vectors.items() if code in v["event_types"])
                   for code in sorted(EVENT_TYPES)},
    }
    files["manifest.json"] = encode_json(manifest)
    return files


def _file_digest(data: bytes) -> str:
    from commitments.hashing import h

    return h(data).hex()


def write(directory: Path = DEFAULT_DIR) -> list[str]:
    """Write every file (and remove stale .json files); return the names written."""
    files = generate_all()
    directory.mkdir(parents=True, exist_ok=True)
    for stale in sorted(directory.glob("*.json")):
        if stale.name not in files:
            stale.unlink()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return sorted(files)


def check(directory: Path = DEFAULT_DIR) -> list[str]:
    """What differs between `directory` and a fresh generation: one line per file (none: equal)."""
    files = generate_all()
    problems = []
    present = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    for name, data in files.items():
        path = directory / name
        if name not in present:
            problems.append(f"{path}: missing")
        elif path.read_bytes() != data:
            problems.append(f"{path}: differs from a fresh generation")
    problems += [f"{directory / name}: no case generates it" for name in sorted(present - set(files))]
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("write", "check") or len(args) > 2:
        print("usage: python -m chain.protocol.vectors write|check [dir]", file=sys.stderr)
        return 2
    directory = Path(args[1]) if len(args) == 2 else DEFAULT_DIR
    try:
        if args[0] == "write":
            names = write(directory)
            print(f"wrote {len(names)} files to {directory}")
            return 0
        problems = check(directory)
    except VectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} file(s) differ: regenerate with `python -m chain.protocol.vectors write`",
              file=sys.stderr)
        return 1
    print(f"{len(CASES)} cases in {directory} match a fresh generation")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
