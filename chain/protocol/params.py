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
MAX_DISPUTE_SEATS = 4096  # seats of a dispute round (one per verifier_stake of free bond)
# Witness commitments, reveals and escalations of one challenge: one per seated account, and a
# round never seats more accounts than it has seats, so no list is ever full before its seats are.
MAX_WITNESSES_PER_CHALLENGE = MAX_DISPUTE_SEATS
MAX_CHALLENGES_PER_RUN = 64  # challenges_per_run and forced_challenge_steps
MAX_REASON_CHARS = 300  # the reason text a CallRefused event keeps
MAX_SCHEDULED_CHANGES = 16  # configure_network records waiting for their effective block
MAX_VERIFIERS = (
    4096  # accounts in the verifier registry: those holding any bond (active, unbonding or reserved)
)
MAX_BOND = (
    1 << 48
)  # one verifier's active plus unbonding bond, in protocol units: 4096 of them stay below 2^63
MAX_UNBONDING_PER_VERIFIER = 16  # unbonding amounts of one verifier waiting for their release block
MAX_COMMITTEE = 256  # seats of one round's drawn committee
MAX_MIRRORS = 4  # further addresses of one opening


# --- The parameters' ranges ------------------------------------------------------------------
# Every parameter has an upper bound, derived from what it feeds so that no value a
# configure_network record can carry makes a derived number leave 63 bits (the snapshot's CBOR
# integers, SQLite's INTEGER and PostgreSQL's BIGINT columns of the node database all hold them).
INT63 = (1 << 63) - 1  # the largest value a signed 64-bit column holds

# Block numbers. MAX_BLOCK is the latest block a node follows and the latest effective_block a
# record may name (Substrate numbers blocks in a u32; a dev chain of one block a millisecond
# reaches 2^62 in 146 million years).
MAX_BLOCK = (1 << 62) - 1

# Windows and delays (commit_window, reveal_window, opening_deadline, challenge_delay,
# unbonding_delay, max_replay_blocks), in blocks. The latest deadline a run can reach, counted from
# the block of its complete root, with every window W at its maximum:
#
#   challenge_delay                              W    (the first draw)
#   + (MAX_CHALLENGES_PER_RUN - 1)               63   (one first-round draw a block)
#   + sum over rounds r = 1..MAX_ROUND of
#       r * (opening + max(commit_window, replay_blocks) + reveal_window) + escalation_window + 1
#                                                45 * 3W + 9W + 9
#                                   (opening, replay_blocks <= max_replay_blocks)
#   = 145 W + 72 < 2^61 + 2^58 + 72 < 2^62           for W = 2^54
#
# (rules._open_round: round r's deadlines are n + opening*r, + max(commit_window, replay_blocks)*r,
# + reveal_window*r, + escalation_window, and the next round opens at the block after the last;
# a run's opening window is max(opening_deadline, its regeneration blocks) <= max_replay_blocks.)
# A verifier's release block is n + unbonding_delay <= MAX_BLOCK + W. So every block number the
# protocol derives stays below MAX_BLOCK + MAX_DEADLINE_SPAN < 2^63.
MAX_MAX_ROUNDS = 8  # the largest max_rounds
MAX_ROUND = (
    MAX_MAX_ROUNDS + 1
)  # a challenge's last round: re-challenges up to max_rounds, one reopened opening
MAX_WINDOW = 1 << 54


def deadline_span(windows: int = MAX_WINDOW, replay_blocks: int = MAX_WINDOW) -> int:
    """The most blocks from a run's complete root to its last challenge's last deadline, when every
    window and delay is `windows` blocks and a run's replay needs `replay_blocks` (the sum above)."""
    w = max(windows, replay_blocks)
    rounds = sum(r * (w + w + windows) + windows + 1 for r in range(1, MAX_ROUND + 1))
    return windows + (MAX_CHALLENGES_PER_RUN - 1) + rounds


MAX_DEADLINE_SPAN = deadline_span()  # 145 * 2^54 + 72

# Stakes, penalties and fees (miner_stake, verifier_stake, slash_amount, no_show_penalty,
# outlier_penalty, escalation_stake, fee_per_replay_block), in protocol units: at most MAX_BOND,
# one verifier's bond. A run's escrow is at most fee_per_replay_block * max_replay_blocks *
# MAX_CHALLENGES_PER_RUN * MAX_COMMITTEE * (2^MAX_MAX_ROUNDS - 1) -- refused at registration
# past MAX_BOND (rules._start). A penalty is taken
# per seat: at most MAX_BOND * MAX_DISPUTE_SEATS = 2^48 * 2^12 = 2^60 asked of one verifier; the
# bonds of all verifiers sum to at most MAX_BOND * MAX_VERIFIERS = 2^60; a miner's open runs stake
# at most MAX_BOND * MAX_OPEN_RUNS_PER_MINER = 2^56. The running totals kept over a chain's life
# (stake ever bonded, total slashed or penalised) saturate at INT63.
MAX_STAKE = MAX_BOND

# Counts. quorum_min_reveals is at most MAX_WITNESSES_PER_CHALLENGE: a challenge never holds more
# reveals than commitments. quorum_share's numerator and denominator are at most 2^32 - 1: the
# quorum test's cross products with a committee's seats (<= MAX_DISPUTE_SEATS = 2^12) stay below
# 2^44, and the record's CBOR holds them as they are.
MAX_QUORUM_TERM = (1 << 32) - 1

# Window sizing (block_seconds, reference_flops, reference_bytes_per_s, replay_margin) only divides
# or scales the exact rational replay time (cost.replay_cost): its results are compared with
# max_replay_blocks before anything keeps them, so these four need only fit a stored integer.
MAX_SIZING = INT63

# name -> (least, greatest) of every integer parameter.
PARAM_RANGES: dict[str, tuple[int, int]] = {
    "commit_window": (1, MAX_WINDOW),
    "reveal_window": (1, MAX_WINDOW),
    "opening_deadline": (1, MAX_WINDOW),
    "challenges_per_run": (1, MAX_CHALLENGES_PER_RUN),
    "challenge_delay": (1, MAX_WINDOW),
    "quorum_min_reveals": (1, MAX_WITNESSES_PER_CHALLENGE),
    "miner_stake": (0, MAX_STAKE),
    "verifier_stake": (1, MAX_STAKE),  # a committee seat needs a bond
    "slash_amount": (0, MAX_STAKE),
    "committee_size": (1, MAX_COMMITTEE),
    "max_rounds": (1, MAX_MAX_ROUNDS),
    "no_show_penalty": (0, MAX_STAKE),
    "outlier_penalty": (0, MAX_STAKE),
    "unbonding_delay": (1, MAX_WINDOW),
    "block_seconds": (1, MAX_SIZING),
    "reference_flops": (1, MAX_SIZING),
    "reference_bytes_per_s": (1, MAX_SIZING),
    "replay_margin": (1, MAX_SIZING),
    "max_replay_blocks": (1, MAX_WINDOW),
    "planck_per_unit": (1, INT63),  # chain balance units (planck) per protocol unit, on Substrate
    "fee_per_replay_block": (0, MAX_STAKE),
    "escalation_window": (1, MAX_WINDOW),
    "escalation_stake": (1, MAX_STAKE),
}

# Fractions of the record, each [numerator, denominator] in lowest terms: name -> (may be 0?).
FRACTION_PARAMS: dict[str, bool] = {"quorum_share": False, "slash_reward_share": True,
                                    "dispute_honest_share": False}


def _shown(v: int) -> str:
    """A bound as the docs write it: 2^k or 2^k - 1 for the large ones."""
    for k in range(31, 64):
        if v == 1 << k:
            return f"2^{k}"
        if v == (1 << k) - 1:
            return f"2^{k}-1"
    return str(v)


class ParamRangeError(ValueError):
    """A protocol parameter outside its range; the message names it, its value and its range."""

    def __init__(self, name: str, value: Any, lo: int, hi: int, kind: str = "an integer", *,
                 range_text: str | None = None) -> None:
        shown = range_text or f"{_shown(lo)}..{_shown(hi)}"
        super().__init__(f"protocol parameter {name} must be {kind} in {shown}, got {value!r}")
        self.name, self.value, self.lo, self.hi = name, value, lo, hi


def _kind(lo: int) -> str:
    return "a positive integer" if lo == 1 else "a non-negative integer"


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
    # Protocol v3: money.
    # A Substrate bond, stake or escrow transfer of k protocol units moves k * planck_per_unit planck.
    planck_per_unit: int = 10**10
    # Each seat of a resolved round's winning cluster is paid fee_per_replay_block * the run's
    # replay_blocks from the run's escrow (rules._start sizes the escrow for every round below the
    # dispute round of every challenge).
    fee_per_replay_block: int = 2
    slash_reward_share: Fraction = Fraction(1, 2)  # of a slash, paid to the resolving round's winning seats
    # A dispute round judges a step honest only if the seats backing the miner's value hold more
    # than this share of its revealed seats (refusals count against the miner: serving is its duty).
    dispute_honest_share: Fraction = Fraction(1, 2)
    # After a round below the dispute round, a seat that revealed another value than the winning
    # cluster's may escalate to the dispute round for escalation_window blocks, reserving
    # escalation_stake of its free bond, which it loses if the dispute proves it wrong.
    escalation_window: int = 2
    escalation_stake: int = 500

    def __post_init__(self) -> None:
        for name in FRACTION_PARAMS:
            object.__setattr__(self, name, Fraction(getattr(self, name)))
        object.__setattr__(self, "forced_challenge_steps", tuple(self.forced_challenge_steps))
        for name, (lo, hi) in PARAM_RANGES.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"protocol parameter {name} must be {_kind(lo)}, got {v!r}")
            if not lo <= v <= hi:
                raise ParamRangeError(name, v, lo, hi, _kind(lo))
        for name, zero in FRACTION_PARAMS.items():
            q = getattr(self, name)
            if not (0 <= q if zero else 0 < q) or q > 1 or q.denominator > MAX_QUORUM_TERM:
                raise ParamRangeError(name, str(q), 0, 1, "a fraction",
                                      range_text=f"{'[' if zero else '('}0, 1] with a denominator of at most "
                                                 f"{_shown(MAX_QUORUM_TERM)}")
        if self.dispute_honest_share >= 1:  # nothing could be more than every revealed seat
            raise ParamRangeError(
                "dispute_honest_share",
                str(self.dispute_honest_share),
                0,
                1,
                "a fraction",
                range_text=f"(0, 1) with a denominator of at most {_shown(MAX_QUORUM_TERM)}",
            )
        # Every penalty is paid in full: a unit of verifier_stake backs at most one seat of a round
        # below the dispute round and one seat of the dispute round at once, each paying at most
        # one penalty, so two penalties must fit in it.
        for name in ("no_show_penalty", "outlier_penalty"):
            if 2 * getattr(self, name) > self.verifier_stake:
                raise ParamRangeError(
                    name,
                    getattr(self, name),
                    0,
                    self.verifier_stake // 2,
                    _kind(0),
                    range_text=f"0..verifier_stake / 2 ({self.verifier_stake // 2}): a unit of "
                    f"bond backs a round's seat and a dispute seat at once",
                )
        steps = self.forced_challenge_steps
        if any(isinstance(t, bool) or not isinstance(t, int) for t in steps):
            raise ValueError(
                f"protocol parameter forced_challenge_steps must be steps (integers), got {list(steps)!r}"
            )
        for t in steps:
            if not 1 <= t <= MAX_DECLARED_STEPS:
                raise ParamRangeError("forced_challenge_steps", t, 1, MAX_DECLARED_STEPS, "steps")
        if len(steps) > MAX_CHALLENGES_PER_RUN:
            raise ParamRangeError("forced_challenge_steps", f"{len(steps)} steps", 0, MAX_CHALLENGES_PER_RUN,
                                  "a list of steps", range_text=f"lengths 0..{MAX_CHALLENGES_PER_RUN}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in FRACTION_PARAMS:
            q = getattr(self, name)
            d[name] = [q.numerator, q.denominator]
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
                f"unknown protocol parameter(s) {', '.join(sorted(unknown))}; known: "
                f"{', '.join(sorted(known))}"
            )
        for name in FRACTION_PARAMS:
            if name in d:
                q = d[name]
                try:
                    d[name] = Fraction(*q) if isinstance(q, (list, tuple)) else Fraction(str(q))
                except (TypeError, ValueError, ZeroDivisionError):
                    raise ValueError(f"{name} must be a fraction such as \"2/3\", got {q!r}") from None
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
        return digest("pot/protocol-params/v3", self.to_dict())

    def differences(self, other: ProtocolParams) -> list[str]:
        """"name: mine != theirs" for every parameter that differs, in field order."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]
