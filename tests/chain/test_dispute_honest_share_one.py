"""`dispute_honest_share` is a fraction in (0, 1): at 1 no cluster could hold more than every
revealed seat, and a unanimous dispute round would have no verdict (found against the core of
040b299, where the range was (0, 1] and such a round raised at every block). The constructor and a
configure_network record refuse it, naming it; below 1 a unanimous round is honest, and a round
with nothing but other values is fraud with no winning value to pay."""

from __future__ import annotations

from fractions import Fraction

import pytest

from chain.protocol import ProtocolParams
from chain.protocol.params import ParamRangeError
from challenges.verdict import FRAUD, HONEST, Reveal, decide

LEAF, PROOF = b"\x01" * 32, b"\x02" * 32


def _decide(reveals, share):
    return decide(
        reveals,
        mode="value",
        opening_submitted=True,
        expected_value=LEAF,
        quorum_min_reveals=1,
        quorum_share=Fraction(1, 2),
        committee_size=len(reveals),
        dispute=True,
        refused_value=b"\xff" * 32,
        seats={r.verifier: 1 for r in reveals},
        honest_share=share,
    )


def test_a_share_of_one_is_refused_naming_the_parameter():
    with pytest.raises(ParamRangeError, match="dispute_honest_share must be a fraction in \\(0, 1\\)"):
        ProtocolParams(dispute_honest_share=Fraction(1))
    with pytest.raises(ValueError, match="dispute_honest_share"):
        ProtocolParams.from_dict({"dispute_honest_share": [1, 1]})


def test_a_unanimous_dispute_round_is_honest_at_the_largest_share():
    reveals = [Reveal(f"v{i}", LEAF, 0, PROOF) for i in range(3)]
    assert _decide(reveals, Fraction(2, 3)).verdict == HONEST  # 3 of 3 > 2/3


def test_lazy_copies_of_the_public_value_count_for_neither_side_in_a_dispute_round():
    # One replayed pair (2 seats), one other value (1 seat), three copies of H(leaf t) each with a
    # proof of its own: 2 of 3 back the miner; the copies prove no replay and count for nobody.
    reveals = [
        Reveal("r1", LEAF, 0, PROOF),
        Reveal("r2", LEAF, 0, PROOF),
        Reveal("x", b"\x09" * 32, 0, PROOF),
    ]
    lazy = [Reveal(f"lazy{i}", LEAF, 0, bytes([i + 3]) * 32) for i in range(3)]
    result = _decide(reveals + lazy, Fraction(1, 2))
    assert result.verdict == HONEST and set(result.winners) == {"r1", "r2"}
    assert set(result.outliers) == {"x", "lazy0", "lazy1", "lazy2"}
    # The same copies beside a forged step's honest replayers: 1 backs the forged value, 2 oppose it.
    forged = [
        Reveal("c", LEAF, 0, b"\x0a" * 32),
        Reveal("h1", b"\x09" * 32, 0, PROOF),
        Reveal("h2", b"\x09" * 32, 0, PROOF),
    ]
    result = _decide(forged + lazy, Fraction(1, 2))
    assert result.verdict == FRAUD and set(result.winners) == {"h1", "h2"}
    assert set(result.outliers) == {"c", "lazy0", "lazy1", "lazy2"}
