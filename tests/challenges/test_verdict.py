"""The clustering verdict: quorum, ties, honest/fraud against leaf t or the declared bucket."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from challenges.verdict import FRAUD, HONEST, INCONCLUSIVE, Reveal, VerdictError, decide

LEAF, NOISE, OTHER = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
Q = {"quorum_min_reveals": 3, "quorum_share": Fraction(1, 2)}


def rv(*pairs):
    return [Reveal(f"v{i}", value, bucket) for i, (value, bucket) in enumerate(pairs)]


def test_honest_with_outlier():
    r = decide(rv((LEAF, 0), (LEAF, 0), (NOISE, 0)), mode="value", opening_submitted=True,
               expected_value=LEAF, **Q)
    assert r.verdict == HONEST and r.winning_value == LEAF
    assert r.cluster_size == 2 and r.reveals == 3 and r.outliers == ("v2",)
    assert r.clusters == ((LEAF, 2), (NOISE, 1))


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
