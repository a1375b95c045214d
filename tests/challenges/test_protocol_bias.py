"""bench/protocol_bias.py: its simulations agree with the closed forms, and the comparisons it prints
(v2 against v1, one account against many) hold as stated."""

from __future__ import annotations

import importlib.util
import json
import math
import random
from itertools import pairwise
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "protocol_bias.py"
_spec = importlib.util.spec_from_file_location("protocol_bias", PATH)
pb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pb)

BIG = 10**6  # steps: the distinct-step redraw hardly ever happens, so the closed forms hold


def tol(p: float, trials: int) -> float:
    """4.5 standard errors of a share of `trials`, at least one trial's worth."""
    return 4.5 * math.sqrt(p * (1 - p) / trials) + 1 / trials


@pytest.mark.parametrize("phi", [0.05, 0.1, 0.25])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("r", [0, 1, 100])
def test_closed_forms_without_adversarial_authors_are_the_honest_baseline(phi, k, r):
    assert pb.escape_v1_closed(0.0, r, phi, k) == pytest.approx(pb.escape_honest(phi, k), abs=1e-12)
    assert pb.escape_v2_closed(0.0, r, phi, k) == pytest.approx(pb.escape_honest(phi, k), abs=1e-12)
    # no re-seal (r = 0) is no advantage either, whoever authors
    assert pb.escape_v1_closed(0.5, 0, phi, k) == pytest.approx(pb.escape_honest(phi, k), abs=1e-12)
    assert pb.escape_v2_closed(0.5, 0, phi, k) == pytest.approx(pb.escape_honest(phi, k), abs=1e-12)


@pytest.mark.parametrize("design,f,r,phi,k", [
    ("v1", 1 / 3, 10, 0.1, 4), ("v2", 1 / 3, 10, 0.1, 4), ("v2", 0.5, 1, 0.1, 8), ("v1", 0.5, 100, 0.25, 4),
    ("v1", 0.0, 100, 0.1, 8), ("v2", 0.0, 100, 0.1, 8),
])
def test_simulated_escape_agrees_with_the_closed_form(design, f, r, phi, k):
    trials = 4000
    closed = (pb.escape_v1_closed if design == "v1" else pb.escape_v2_closed)(f, r, phi, k)
    sim = pb.simulate_escape(design, f, r, phi, k, steps=BIG, trials=trials, rng=random.Random(7))
    assert abs(sim - closed) <= tol(closed, trials), (sim, closed)
    if f == 0.0:
        assert abs(sim - pb.escape_honest(phi, k)) <= tol(closed, trials)


def test_simulation_is_reproducible_from_its_seed():
    a = pb.simulate_escape("v2", 0.5, 10, 0.1, 4, steps=1000, trials=500, rng=random.Random(3))
    b = pb.simulate_escape("v2", 0.5, 10, 0.1, 4, steps=1000, trials=500, rng=random.Random(3))
    assert a == b


@pytest.mark.parametrize("phi", [0.05, 0.1, 0.25])
@pytest.mark.parametrize("k", [2, 4, 8, 16])
@pytest.mark.parametrize("f", [0.1, 1 / 3, 0.5])
def test_v2_leaks_less_than_v1_from_a_few_reseals_on_and_more_at_one(phi, k, f):
    cross = pb.crossover_r(f, phi, k)
    assert cross is not None and cross >= 2
    for r in (cross, cross + 1, 10 * cross, 10**4):
        assert pb.escape_v2_closed(f, r, phi, k) <= pb.escape_v1_closed(f, r, phi, k)
    # one re-seal: (1 + f phi)^k > 1 + f (1 - (1 - phi)^k), so v2 lets more through than v1
    assert pb.escape_v2_closed(f, 1, phi, k) > pb.escape_v1_closed(f, 1, phi, k)
    # the limits as r grows: v2's is below v1's chord
    p = (1 - phi) ** k
    assert (1 - (1 - f) * phi) ** k < f + (1 - f) * p
    assert pb.escape_v2_closed(f, 10**6, phi, k) == pytest.approx((1 - (1 - f) * phi) ** k)
    assert pb.escape_v1_closed(f, 10**6, phi, k) == pytest.approx(f + (1 - f) * p)


def test_simulated_v2_is_below_v1_with_many_reseals():
    trials = 4000
    v1 = pb.simulate_escape("v1", 0.5, 100, 0.1, 8, steps=BIG, trials=trials, rng=random.Random(11))
    v2 = pb.simulate_escape("v2", 0.5, 100, 0.1, 8, steps=BIG, trials=trials, rng=random.Random(12))
    assert v2 < v1 - 0.02, (v1, v2)  # closed forms 0.663 and 0.715


def test_committee_simulation_agrees_with_the_exact_draw():
    trials = 3000
    for accounts, seats in ((10, 9), (10, 5), (1, 9)):
        w, adv = pb.stakes(1 / 3, accounts)
        exact = pb.capture_exact(accounts, w[0], 20, pb.HONEST_STAKE, seats)
        sim = pb.capture_probability(w, adv, seats, trials=trials, rng=random.Random(5))
        assert abs(sim - exact) <= tol(exact, trials), (accounts, seats, sim, exact)


def test_stakes_give_the_adversary_its_share():
    for s in pb.S_VALUES:
        for m in (1, 10, 1000):
            w, adv = pb.stakes(s, m)
            assert adv == m and len(w) == m + 20 and len(set(w[:m])) == 1
            assert sum(w[:m]) / sum(w) == pytest.approx(s, abs=1e-6)


def test_one_account_holds_at_most_one_seat_without_replacement():
    w, adv = pb.stakes(0.45, 1)
    rng = random.Random(2)
    for seats in (5, 9, 17, 40):
        assert pb.capture_exact(1, w[0], 20, pb.HONEST_STAKE, seats) == 0.0
        committee = pb.draw_committee(rng, w, min(seats, len(w)))
        assert len(set(committee)) == len(committee)
    assert pb.capture_probability(w, adv, 5, trials=500, rng=rng) == 0.0


def test_splitting_does_not_raise_capture_with_replacement():
    trials = 3000
    binom = pb.capture_with_replacement(1 / 3, 9)
    one = pb.capture_probability(*pb.stakes(1 / 3, 1), 9, trials=trials, rng=random.Random(21), replace=True)
    ten = pb.capture_probability(*pb.stakes(1 / 3, 10), 9, trials=trials, rng=random.Random(22), replace=True)
    assert abs(one - binom) <= tol(binom, trials) and abs(ten - binom) <= tol(binom, trials), (
        one,
        ten,
        binom,
    )
    assert abs(ten - one) <= 2 * tol(binom, trials)


def test_splitting_raises_capture_without_replacement():
    # the draw without replacement counts accounts, not stake: more, smaller accounts capture more
    for s in pb.S_VALUES:
        for seats in pb.N_VALUES:
            values = [
                pb.capture_exact(m, pb.stakes(s, m)[0][0], 20, pb.HONEST_STAKE, seats) for m in pb.SPLITS
            ]
            assert values[0] == 0.0
            assert all(a <= b + 1e-15 for a, b in pairwise(values)), (s, seats, values)
            assert values[-1] > pb.capture_with_replacement(s, seats)


def test_escalation_simulation_agrees_with_the_product_of_rounds():
    w, adv = pb.stakes(0.45, 10)
    sizes = (5, 10, 20)
    exact = math.prod(pb.capture_exact(10, w[0], 20, pb.HONEST_STAKE, n) for n in sizes)
    trials = 3000
    sim = pb.escalation_probability(w, adv, sizes, trials=trials, rng=random.Random(9))
    assert abs(sim - exact) <= tol(exact, trials), (sim, exact)


def test_bad_arguments_are_named():
    rng = random.Random(0)
    with pytest.raises(ValueError, match="design"):
        pb.simulate_escape("v3", 0.1, 1, 0.1, 4, trials=10, rng=rng)
    with pytest.raises(ValueError, match="phi"):
        pb.simulate_escape("v2", 0.1, 1, 1.5, 4, trials=10, rng=rng)
    with pytest.raises(ValueError, match="k .challenges."):
        pb.simulate_escape("v2", 0.1, 1, 0.1, 0, trials=10, rng=rng)
    with pytest.raises(ValueError, match="s .adversary stake share."):
        pb.stakes(1.0, 1)
    with pytest.raises(ValueError, match="without replacement"):
        pb.draw_committee(rng, [1, 2, 3], 4)


def test_cli_prints_one_reproducible_json_line(capsys):
    argv = ["--json", "--trials", "200", "--committee-trials", "50", "--k", "1,4", "--seed", "4"]
    assert pb.main(argv) == 0
    first = capsys.readouterr().out.strip().splitlines()
    assert pb.main(argv) == 0
    second = capsys.readouterr().out.strip().splitlines()
    assert len(first) == 1
    a, b = json.loads(first[0]), json.loads(second[0])
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    assert len(a["escape"]) == 2 * len(pb.F_VALUES) * len(pb.R_VALUES)
    assert len(a["committee"]) == len(a["escalation"]) == len(pb.S_VALUES) * len(pb.N_VALUES)
    assert {row["k"] for row in a["crossover"]} == {4}


def test_cli_prints_markdown_tables_then_json(capsys):
    assert pb.main(["--trials", "100", "--committee-trials", "20", "--k", "4"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "| f | r | k | honest (1-phi)^k | v1 simulated | v1 closed | v2 simulated | v2 closed |" in out
    assert any(line.startswith("| s | N | 1 account sim") for line in out)
    json.loads(out[-1])
