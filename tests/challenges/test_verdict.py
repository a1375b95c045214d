"""The clustering verdict: quorum (of the committee's seats), ties, the dispute round's plurality,
honest/fraud against leaf t or the declared bucket, and a refused winning cluster."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from challenges.refused import REFUSED_BUCKET
from challenges.verdict import FRAUD, HONEST, INCONCLUSIVE, REFUSED, Reveal, VerdictError, decide

LEAF, NOISE, OTHER = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
PROOF = b"\x0a" * 32  # the proof half an honest replay reveals alongside H(leaf t)
REF = b"\x0f" * 32  # the challenge's refused value
Q = {"quorum_min_reveals": 3, "quorum_share": Fraction(1, 2)}
ZERO = bytes(32)  # Reveal's proof half when none is given


def rv(*pairs):
    return [Reveal(f"v{i}", value, bucket) for i, (value, bucket) in enumerate(pairs)]


def pr(*triples):
    """Reveals of whole witness pairs: (value hash, proof hash)."""
    return [Reveal(f"v{i}", value, 0, proof) for i, (value, proof) in enumerate(triples)]


def test_honest_with_outlier():
    r = decide(rv((LEAF, 0), (LEAF, 0), (NOISE, 0)), mode="value", opening_submitted=True,
               expected_value=LEAF, **Q)
    assert r.verdict == HONEST and r.winning_value == LEAF
    assert r.cluster_size == 2 and r.reveals == 3 and r.outliers == ("v2",)
    assert r.clusters == ((LEAF + ZERO, 2), (NOISE + ZERO, 1))  # exact profiles cluster the whole pair


def test_fraud_when_cluster_differs_from_leaf():
    r = decide(rv((OTHER, 0), (OTHER, 0), (OTHER, 0)), mode="value", opening_submitted=True,
               expected_value=LEAF, **Q)
    assert r.verdict == FRAUD and r.winning_value == OTHER and r.outliers == ()
    assert "differs from H(leaf t)" in r.reason


def test_missing_opening_is_fraud_whatever_the_reveals():
    r = decide(rv((LEAF, 0), (LEAF, 0), (LEAF, 0)), mode="value", opening_submitted=False, **Q)
    assert r.verdict == FRAUD and "no opening" in r.reason


def test_too_few_reveals_inconclusive():
    r = decide(rv((LEAF, 0), (LEAF, 0)), mode="value", opening_submitted=True, expected_value=LEAF, **Q)
    assert r.verdict == INCONCLUSIVE and "quorum needs 3" in r.reason and r.outliers == ()


def test_tie_inconclusive():
    r = decide(rv((LEAF, 0), (LEAF, 0), (NOISE, 0), (NOISE, 0)), mode="value", opening_submitted=True,
               expected_value=LEAF, **Q)
    assert r.verdict == INCONCLUSIVE and "tie" in r.reason


def test_share_not_met_inconclusive():
    r = decide(rv((LEAF, 0), (LEAF, 0), (NOISE, 0), (OTHER, 0), (b"\x04" * 32, 0)), mode="value",
               opening_submitted=True, expected_value=LEAF, quorum_min_reveals=3, quorum_share=Fraction(1, 2))
    assert r.verdict == INCONCLUSIVE and "below the quorum share" in r.reason


def test_bucket_mode_compares_declared_bucket():
    reveals = rv((LEAF, 7), (NOISE, 7), (OTHER, 9))  # values differ across hardware; buckets cluster
    r = decide(reveals, mode="bucket", opening_submitted=True, declared_bucket=7, **Q)
    assert r.verdict == HONEST and r.winning_value == 7 and r.outliers == ("v2",)
    r = decide(reveals, mode="bucket", opening_submitted=True, declared_bucket=8, **Q)
    assert r.verdict == FRAUD
    r = decide(reveals, mode="bucket", opening_submitted=True, declared_bucket=None, **Q)
    assert r.verdict == FRAUD and "no reference norm bucket" in r.reason


@given(st.lists(st.tuples(st.sampled_from([LEAF, NOISE, OTHER]), st.integers(0, 2)), max_size=8),
       st.randoms())
def test_order_does_not_matter(pairs, rnd):
    reveals = rv(*pairs)
    shuffled = list(reveals)
    rnd.shuffle(shuffled)
    for mode in ("value", "bucket"):
        kw = {"mode": mode, "opening_submitted": True, "expected_value": LEAF, "declared_bucket": 1, **Q}
        assert decide(reveals, **kw) == decide(shuffled, **kw)


def test_bad_parameters_refused():
    with pytest.raises(VerdictError, match="mode"):
        decide([], mode="vote", opening_submitted=True, **Q)  # type: ignore[arg-type]
    with pytest.raises(VerdictError, match="quorum_share"):
        decide([], mode="value", opening_submitted=True, quorum_min_reveals=1, quorum_share=Fraction(3, 2))
    with pytest.raises(VerdictError, match="two different reveals"):
        decide([Reveal("v", LEAF, 0), Reveal("v", NOISE, 0)], mode="value", opening_submitted=True, **Q)


# --- the witness pair ---------------------------------------------------------------------------


def test_value_mode_clusters_the_whole_pair():
    # Three reveal H(leaf t) but only two hold the replay's proof: a copied leaf hash with a made-up
    # proof half is its own cluster, an outlier, not a vote for the value.
    r = decide(pr((LEAF, PROOF), (LEAF, PROOF), (LEAF, NOISE)), mode="value", opening_submitted=True,
               expected_value=LEAF, quorum_min_reveals=2, quorum_share=Fraction(1, 2))
    assert r.verdict == HONEST and r.winning_value == LEAF and r.cluster_size == 2 and r.outliers == ("v2",)
    assert r.clusters == ((LEAF + PROOF, 2), (LEAF + NOISE, 1))
    # Split proofs under one value: no cluster holds half of the seats.
    r = decide(pr((LEAF, PROOF), (LEAF, NOISE), (LEAF, OTHER)), mode="value", opening_submitted=True,
               expected_value=LEAF, quorum_min_reveals=2, quorum_share=Fraction(1, 2))
    assert r.verdict == INCONCLUSIVE


# --- quorum of the committee --------------------------------------------------------------------


def test_quorum_share_counts_the_committee_seats_not_the_reveals():
    reveals = pr((LEAF, PROOF), (LEAF, PROOF), (LEAF, PROOF))
    kw = {"mode": "value", "opening_submitted": True, "expected_value": LEAF, **Q}
    assert decide(reveals, **kw).verdict == HONEST  # 3 of 3 reveals
    assert decide(reveals, committee_size=5, **kw).verdict == HONEST  # 3 of 5 seats
    r = decide(reveals, committee_size=7, **kw)  # 3 of 7 seats: below one half
    assert r.verdict == INCONCLUSIVE and "3 of 7 committee seats" in r.reason
    r = decide(reveals, committee_size=6, **kw)  # exactly one half meets the share
    assert r.verdict == HONEST


def test_dispute_round_takes_the_plurality():
    reveals = pr((LEAF, PROOF), (LEAF, PROOF), (LEAF, PROOF), (NOISE, PROOF), (OTHER, PROOF))
    kw = {"mode": "value", "opening_submitted": True, "expected_value": LEAF, "committee_size": 20, **Q}
    assert decide(reveals, **kw).verdict == INCONCLUSIVE  # 3 of 20 seats
    r = decide(reveals, dispute=True, **kw)
    assert r.verdict == HONEST and r.cluster_size == 3 and r.outliers == ("v3", "v4")
    # The dispute round still needs a winner: a tie or too few reveals leave it inconclusive.
    tie = pr((LEAF, PROOF), (LEAF, PROOF), (NOISE, PROOF), (NOISE, PROOF))
    assert decide(tie, dispute=True, **kw).verdict == INCONCLUSIVE
    assert decide(pr((LEAF, PROOF), (LEAF, PROOF)), dispute=True, **kw).verdict == INCONCLUSIVE
    # A plurality against H(leaf t) in the dispute round is fraud.
    fraud = pr((OTHER, PROOF), (OTHER, PROOF), (OTHER, PROOF), (LEAF, PROOF))
    assert decide(fraud, dispute=True, **kw).verdict == FRAUD


# --- a refused winning cluster ------------------------------------------------------------------


def test_a_refused_winning_cluster_is_refused_in_value_mode():
    reveals = pr((REF, REF), (REF, REF), (REF, REF), (LEAF, PROOF))
    kw = {"mode": "value", "opening_submitted": True, "expected_value": LEAF, "refused_value": REF, **Q}
    r = decide(reveals, **kw)
    assert r.verdict == REFUSED and r.winning_value == REF and r.cluster_size == 3 and r.outliers == ("v3",)
    # Without the refused value given, the same cluster is only a value that differs from H(leaf t).
    assert decide(reveals, **{**kw, "refused_value": None}).verdict == FRAUD
    # A refused minority changes nothing.
    honest = pr((LEAF, PROOF), (LEAF, PROOF), (LEAF, PROOF), (REF, REF))
    r = decide(honest, **kw)
    assert r.verdict == HONEST and r.outliers == ("v3",)


def test_a_refused_winning_cluster_is_refused_in_bucket_mode():
    reveals = [Reveal(f"v{i}", REF, REFUSED_BUCKET, REF) for i in range(3)] + [Reveal("v3", LEAF, 7)]
    kw = {
        "mode": "bucket",
        "opening_submitted": True,
        "declared_bucket": 7,
        "refused_bucket": REFUSED_BUCKET,
        **Q,
    }
    r = decide(reveals, **kw)
    assert r.verdict == REFUSED and r.winning_value == REFUSED_BUCKET and r.outliers == ("v3",)
    # The refused bucket wins over a missing declaration too: the opening is what failed.
    assert decide(reveals, **{**kw, "declared_bucket": None}).verdict == REFUSED
    honest = [Reveal(f"v{i}", NOISE, 7) for i in range(3)] + [Reveal("v3", REF, REFUSED_BUCKET, REF)]
    assert decide(honest, **kw).verdict == HONEST
