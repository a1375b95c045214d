"""The protocol's parameters: every constant of the protocol in one frozen record, with the
checks that keep it usable and its mapping form (snapshots, operator config files)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from typing import Any

from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import digest

# Caps on what the protocol state keeps, enforced when a call is applied: a call over one is
# refused with FieldTooLarge or TooMany (docs/protocol.md lists them). They bound the state, and
# so every snapshot, whatever the chain carries; each is far above what an honest run needs.
MAX_SPEC_BYTES = 16 * 1024  # a registration's canonical spec CBOR
MAX_ENDPOINT_BYTES = 512  # a run's endpoint (UTF-8)
MAX_URI_BYTES = 512  # an opening's URI (UTF-8)
MAX_LEAF_BYTES = 1024  # an opened step leaf
MAX_DECLARED_STEPS = 100_000_000  # a run's declared steps
MAX_OPEN_RUNS_PER_MINER = 256  # runs of one miner whose challenges are not all resolved
MAX_WITNESSES_PER_CHALLENGE = 1024  # witness commitments of one challenge
MAX_CHALLENGES_PER_RUN = 64  # challenges_per_run and forced_challenge_steps
MAX_REASON_CHARS = 300  # the reason text a CallRefused event keeps
MAX_SCHEDULED_CHANGES = 16  # configure_network records waiting for their effective block
MAX_VERIFIERS = 4096  # accounts that ever bonded as verifiers
MAX_BOND = 1 << 48  # one verifier's active plus unbonding bond, in protocol units: 4096 of them stay below 2^63
MAX_UNBONDING_PER_VERIFIER = 16  # unbonding amounts of one verifier waiting for their release block
MAX_COMMITTEE = 256  # seats of one round's drawn committee
MAX_DISPUTE_SEATS = 4096  # seats of a dispute round (one per verifier_stake of bond)
MAX_MIRRORS = 4  # further addresses of one opening


@dataclass(frozen=True)
class ProtocolParams:
    """Every constant of the protocol. Windows and deadlines are counted in blocks."""

    commit_window: int = 4  # the least commit window; a run's replay cost may need more (replay_blocks)
    reveal_window: int = 4
    opening_deadline: int = 4  # blocks after issuance by which the opening must be on chain
    # Challenges per run, each drawn from the hash of its own block (the blocks after the
    # complete root's challenge_delay): steering every draw needs the authors of all of them.
    challenges_per_run: int = 4
    challenge_delay: int = 2  # blocks after the complete root before the first challenge
    quorum_min_reveals: int = 3
    quorum_share: Fraction = Fraction(1, 2)  # share of the committee's seats the winning cluster needs
    miner_stake: int = 1000
    verifier_stake: int = 100  # the least active bond that makes an account eligible for committees
    slash_amount: int = 500
    # Committees: `committee_size` seats in round 1, doubled each re-challenge; from round
    # `max_rounds` on, every eligible verifier sits (the dispute round).
    committee_size: int = 5
    max_rounds: int = 3
    no_show_penalty: int = 50  # a committee member that does not commit, or commits and does not reveal
    outlier_penalty: int = 50  # a committee member that reveals outside the winning cluster
    unbonding_delay: int = 40  # blocks from unbond_verifier to the amount's release
    # Window sizing from a spec's replay cost (chain.protocol.cost): a reference CPU core's exact-v1
    # speed, the bytes a verifier moves and hashes per second, the margin, the block time. A run
    # whose replay needs more than max_replay_blocks blocks is refused at registration.
    block_seconds: int = 6
    reference_flops: int = 4_000_000_000  # exact-v1 FLOP/s of the reference core
    reference_bytes_per_s: int = 50_000_000  # fetch + validate + hash of the opening
    replay_margin: int = 4
    max_replay_blocks: int = 2400
    # Demo/test knob: steps challenged first whatever the randomness says (e.g. (7,)).
    forced_challenge_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "quorum_share", Fraction(self.quorum_share))
        object.__setattr__(self, "forced_challenge_steps", tuple(self.forced_challenge_steps))
        for name in ("commit_window", "reveal_window", "opening_deadline", "challenge_delay",
                     "challenges_per_run", "quorum_min_reveals", "committee_size", "max_rounds",
                     "unbonding_delay", "block_seconds", "reference_flops", "reference_bytes_per_s",
                     "replay_margin", "max_replay_blocks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"protocol parameter {name} must be a positive integer, got {v!r}")
        for name in ("miner_stake", "verifier_stake", "slash_amount", "no_show_penalty", "outlier_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"protocol parameter {name} must be a non-negative integer, got {v!r}")
        if not 0 < self.quorum_share <= 1:
            raise ValueError(f"protocol parameter quorum_share must be in (0, 1], got {self.quorum_share}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in self.forced_challenge_steps):
            raise ValueError("forced_challenge_steps must be steps >= 1")
        if self.challenges_per_run > MAX_CHALLENGES_PER_RUN or len(self.forced_challenge_steps) > MAX_CHALLENGES_PER_RUN:
            raise ValueError(f"challenges_per_run and forced_challenge_steps are capped at {MAX_CHALLENGES_PER_RUN}")
        if self.committee_size > MAX_COMMITTEE:
            raise ValueError(f"protocol parameter committee_size is capped at {MAX_COMMITTEE}")
        if self.max_rounds > 8:
            raise ValueError("protocol parameter max_rounds is capped at 8")
        if self.verifier_stake < 1:
            raise ValueError("protocol parameter verifier_stake must be at least 1: a committee seat needs a bond")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quorum_share"] = [self.quorum_share.numerator, self.quorum_share.denominator]
        d["forced_challenge_steps"] = list(self.forced_challenge_steps)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProtocolParams:
        """Parameters from a mapping (a snapshot, or an operator's config file).

        Missing keys keep their defaults; unknown keys are refused. quorum_share may be
        [numerator, denominator], "2/3", or a number.
        """
        if not isinstance(d, dict):
            raise ValueError(f"protocol parameters must be a mapping, got {type(d).__name__}")
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(
                f"unknown protocol parameter(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
            )
        if "quorum_share" in d:
            q = d["quorum_share"]
            try:
                d["quorum_share"] = Fraction(*q) if isinstance(q, (list, tuple)) else Fraction(str(q))
            except (TypeError, ValueError, ZeroDivisionError):
                raise ValueError(f"quorum_share must be a fraction such as \"2/3\", got {q!r}") from None
        return cls(**d)

    # --- the on-chain record (configure_network) ---------------------------------------------
    def to_cbor(self) -> bytes:
        """The canonical CBOR a configure_network record carries: `to_dict()`, every key present."""
        return cbor.encode(self.to_dict())

    @classmethod
    def from_cbor(cls, data: bytes) -> ProtocolParams:
        """Parameters from a record's bytes; refused (ValueError, naming what differs) unless the
        bytes are exactly the canonical CBOR of a full parameter set."""
        try:
            obj = cbor.decode(data, max_bytes=4096)
        except CommitmentError as exc:
            raise ValueError(f"the parameters are not canonical CBOR: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("the parameters must be a CBOR map of name -> value")
        missing = sorted({f.name for f in fields(cls)} - set(obj))
        if missing:
            raise ValueError(f"the parameters lack {', '.join(missing)}: a record names every parameter")
        params = cls.from_dict(obj)
        if params.to_cbor() != bytes(data):
            raise ValueError("the parameters are not in their canonical form (ProtocolParams.to_dict(), "
                             "quorum_share as [numerator, denominator] in lowest terms)")
        return params

    def digest(self) -> bytes:
        return digest("pot/protocol-params/v2", self.to_dict())

    def differences(self, other: ProtocolParams) -> list[str]:
        """"name: mine != theirs" for every parameter that differs, in field order."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]
