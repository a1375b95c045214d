"""The clustering verdict: verifiers do not vote, they reveal values, and equal values cluster.

Exact profiles cluster reveals by the whole witness pair (value hash H(recomputed leaf t), proof
hash of the recomputed post-state); cross-architecture specs by norm bucket. The largest cluster
wins if it meets the quorum, counted against the committee's seats; the winner's value half is
then compared with what the miner committed (H(leaf t), or its declared bucket). A winning refused
value gives the verdict REFUSED, which the protocol turns into a second opening window or fraud.
Pure: the same reveals in any order give the same result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

HONEST, FRAUD, INCONCLUSIVE = "honest", "fraud", "inconclusive"
REFUSED = (
    "refused"  # the committee's winning cluster refused the opening (decide's answer, never a final verdict)
)
_NO_PROOF = b"\x00" * 32
Mode = Literal["value", "bucket"]


class VerdictError(ValueError):
    """Inputs the verdict cannot be computed from (wrong mode, bad quorum), with the reason."""


@dataclass(frozen=True)
class Reveal:
    """One verifier's accepted reveal."""

    verifier: str
    value_hash: bytes
    norm_bucket: int
    proof_hash: bytes = _NO_PROOF


@dataclass(frozen=True)
class VerdictResult:
    verdict: str  # honest | fraud | inconclusive
    mode: str
    reason: str
    winning_value: bytes | int | None = None  # value hash (mode "value") or bucket (mode "bucket")
    cluster_size: int = 0
    reveals: int = 0
    # (cluster key, size), largest first, ties in key order: the whole picture for a dashboard.
    clusters: tuple[tuple[bytes | int, int], ...] = ()
    outliers: tuple[str, ...] = ()
    winners: tuple[str, ...] = ()  # the verifiers of the winning cluster (paid its seats' fees)


def _of(size: int, revealed: int, n: int, seats: dict[str, int] | None) -> str:
    """How a reason counts a cluster: reveals, or seats when reveals are weighed by seats."""
    if seats is None:
        return f"{size} of {n}"
    return f"{size} of {revealed} revealed seats, {n} verifiers"


def _key(r: Reveal, mode: Mode) -> bytes | int:
    """The cluster key: the whole pair (64 bytes) for exact profiles, the bucket otherwise."""
    return r.value_hash + r.proof_hash if mode == "value" else r.norm_bucket


def decide(
    reveals: Iterable[Reveal],
    *,
    mode: Mode,
    opening_submitted: bool,
    expected_value: bytes | None = None,
    declared_bucket: int | None = None,
    quorum_min_reveals: int,
    quorum_share: Fraction,
    committee_size: int | None = None,
    dispute: bool = False,
    refused_value: bytes | None = None,
    refused_bucket: int | None = None,
    seats: dict[str, int] | None = None,
    honest_share: Fraction | None = None,
) -> VerdictResult:
    """Judge one round of a challenge.

    `expected_value` is H(leaf t) from the opening (mode "value"); `declared_bucket` is the
    miner's declared norm bucket (mode "bucket"). The winning cluster needs at least
    `quorum_min_reveals` reveals in all, no equal rival, and at least `quorum_share` of the
    committee's `committee_size` seats (of the reveals when no committee is given); in a
    `dispute` round (every eligible verifier sits) the largest cluster suffices. A winning
    cluster whose value half is `refused_value` gives REFUSED. `seats` weighs each verifier's
    reveal by the seats it holds; clusters, `quorum_min_reveals` and the quorum share all count
    seats.

    A `dispute` round with an `honest_share` judges the miner, not the clusters: the step is
    HONEST only if the seats whose value half is the miner's (H(leaf t), or its declared bucket)
    hold more than that share of the revealed seats, refused and every other value counting
    against it; otherwise FRAUD (serving the opening to every seat, and being right, are the
    miner's duty). See `_dispute`.
    """
    if mode not in ("value", "bucket"):
        raise VerdictError(f"mode must be 'value' or 'bucket', got {mode!r}")
    share = Fraction(quorum_share)
    if not 0 < share <= 1:
        raise VerdictError(f"quorum_share must be in (0, 1], got {share}")
    if quorum_min_reveals < 1:
        raise VerdictError(f"quorum_min_reveals must be at least 1, got {quorum_min_reveals}")

    if not opening_submitted:
        return VerdictResult(FRAUD, mode, "no opening was submitted before the deadline")

    by_verifier: dict[str, Reveal] = {}
    for r in reveals:
        if r.verifier in by_verifier and by_verifier[r.verifier] != r:
            raise VerdictError(f"verifier {r.verifier!r} has two different reveals")
        by_verifier[r.verifier] = r
    weight = (lambda v: 1) if seats is None else (lambda v: seats.get(v, 0))
    counts: Counter = Counter()
    for v, r in by_verifier.items():
        counts[_key(r, mode)] += weight(v)
    clusters = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    n = len(by_verifier)
    revealed = sum(weight(v) for v in by_verifier)
    base = {"mode": mode, "reveals": n, "clusters": clusters}

    if revealed < quorum_min_reveals:
        what = "reveal(s)" if seats is None else "revealed seat(s)"
        return VerdictResult(
            INCONCLUSIVE, reason=f"{revealed} {what}, the quorum needs {quorum_min_reveals}", **base
        )
    if dispute and honest_share is not None:
        return _dispute(clusters, by_verifier, mode, expected_value, declared_bucket, Fraction(honest_share),
                        revealed, n, seats, base)
    (top, size), *rest = clusters
    if rest and rest[0][1] == size:
        return VerdictResult(
            INCONCLUSIVE, reason=f"tie: the two largest clusters both have {size} reveal(s)", **base
        )
    total = revealed if committee_size is None else committee_size
    if not dispute and Fraction(size, max(total, 1)) < share:
        whom = "revealed seats" if committee_size is None else "committee seats"
        return VerdictResult(
            INCONCLUSIVE,
            reason=f"largest cluster holds {size} of {total} {whom}, below the quorum share {share}",
            **base,
        )

    outliers = tuple(sorted(v for v, r in by_verifier.items() if _key(r, mode) != top))
    if (mode == "value" and refused_value is not None and top[:32] == refused_value) or (
            mode == "bucket" and refused_bucket is not None and top == refused_bucket):
        return VerdictResult(
            REFUSED,
            reason=f"winning cluster ({_of(size, revealed, n, seats)}) refused the opening",
            winning_value=top[:32] if mode == "value" else top,
            cluster_size=size,
            outliers=outliers,
            winners=_winners(by_verifier, top, mode),
            **base,
        )
    return _judge(top, size, by_verifier, mode, expected_value, declared_bucket, revealed, n, seats, base)


def _dispute(clusters: tuple[tuple[bytes | int, int], ...], by_verifier: dict[str, Reveal], mode: Mode,
             expected_value: bytes | None, declared_bucket: int | None, honest_share: Fraction, revealed: int,
             n: int, seats: dict[str, int] | None, base: dict) -> VerdictResult:
    """The dispute round's verdict. The miner's value: H(leaf t) (mode "value") or the declared
    bucket. The seats fall in three parts:

    * backing: the largest cluster of whole pairs with the miner's value (the first in key order on
      a tie) -- a replay of the step, which alone knows its proof;
    * against: every seat that revealed another value, a refusal included;
    * neither: the other seats with the miner's value, each with a proof of its own -- copies of
      the public H(leaf t), which prove no replay, so they count for neither side.

    HONEST when backing holds more than `honest_share` of backing + against; every other reveal is
    then an outlier. Otherwise FRAUD: the winning cluster is the largest with another value, and
    the outliers are the seats that revealed the miner's value. No seat backing or against: the
    step is unresolved (INCONCLUSIVE)."""
    if mode == "value" and expected_value is None:
        raise VerdictError("mode 'value' needs expected_value (H(leaf t)) from the opening")
    mine = (lambda k: k[:32] == expected_value) if mode == "value" else (lambda k: k == declared_bucket)
    if mode == "bucket" and declared_bucket is None:
        mine = (lambda k: False)  # noqa: E731 - nothing was declared: nothing backs the miner
    what = "H(leaf t)" if mode == "value" else f"the declared bucket {declared_bucket}"
    backing_key, backing = next(((k, c) for k, c in clusters if mine(k)), (None, 0))
    others = [(k, c) for k, c in clusters if not mine(k)]
    against = sum(c for _, c in others)
    if backing + against == 0:
        return VerdictResult(
            INCONCLUSIVE, reason="no reveal of the dispute round backs or opposes the miner's value", **base
        )
    if backing_key is not None and Fraction(backing, backing + against) > honest_share:
        outliers = tuple(sorted(v for v, r in by_verifier.items() if _key(r, mode) != backing_key))
        value = backing_key[:32] if mode == "value" else backing_key
        return VerdictResult(
            HONEST,
            reason=f"{backing} seats of the dispute round back {what} with one replayed pair, {against} "
            f"oppose it: more than the share {honest_share}",
            winning_value=value,
            cluster_size=backing,
            outliers=outliers,
            winners=_winners(by_verifier, backing_key, mode),
            **base,
        )
    top, size = others[0]
    value = top[:32] if mode == "value" else top
    outliers = tuple(sorted(v for v, r in by_verifier.items() if mine(_key(r, mode))))
    return VerdictResult(
        FRAUD,
        reason=f"{backing} seats of the dispute round back {what} with one replayed pair, {against} oppose "
        f"it: not more than the share {honest_share}; the miner did not serve, or did not commit, a "
        f"step the network reproduces",
        winning_value=value,
        cluster_size=size,
        outliers=outliers,
        winners=_winners(by_verifier, top, mode),
        **base,
    )


def _judge(
    top: bytes | int,
    size: int,
    by_verifier: dict[str, Reveal],
    mode: Mode,
    expected_value: bytes | None,
    declared_bucket: int | None,
    revealed: int,
    n: int,
    seats: dict[str, int] | None,
    base: dict,
) -> VerdictResult:
    """The verdict of a winning cluster `top` (holding `size`): its value half against what the
    miner committed; the reveals outside it are the outliers."""
    outliers = tuple(sorted(v for v, r in by_verifier.items() if _key(r, mode) != top))
    winners = _winners(by_verifier, top, mode)
    if mode == "value":
        if expected_value is None:
            raise VerdictError("mode 'value' needs expected_value (H(leaf t)) from the opening")
        matches = top[:32] == expected_value
        what = "H(leaf t)"
        top = top[:32]
    else:
        if declared_bucket is None:
            return VerdictResult(
                FRAUD,
                reason="no reference norm bucket was declared for a cross-architecture spec",
                winning_value=top,
                cluster_size=size,
                outliers=outliers,
                winners=winners,
                **base,
            )
        matches = top == declared_bucket
        what = f"the declared bucket {declared_bucket}"
    shown = top.hex()[:16] if isinstance(top, bytes) else str(top)
    return VerdictResult(
        HONEST if matches else FRAUD,
        reason=(
            f"winning cluster ({_of(size, revealed, n, seats)}) {'equals' if matches else 'differs from'} "
            f"{what}: {shown}"
        ),
        winning_value=top,
        cluster_size=size,
        outliers=outliers,
        winners=winners,
        **base,
    )


def _winners(by_verifier: dict[str, Reveal], top: bytes | int, mode: Mode) -> tuple[str, ...]:
    return tuple(sorted(v for v, r in by_verifier.items() if _key(r, mode) == top))
