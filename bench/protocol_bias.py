"""Monte-Carlo measure of protocol v2's challenge draw (residual bias) and committee capture risk.

Nothing here imports the chain: the rules of protocol v2 are modelled directly, each block hash as
an independent uniform draw of `random.Random(seed)`, so the printed numbers are reproducible.

Challenge draw. A complete run of n steps gets k challenges. A miner faked a share phi of its steps
(m = round(phi * n) of them; since every draw is uniform over the steps, which m steps are faked
does not matter, so they are steps 1..m). The run escapes when no challenge lands on a faked step.
Each block is authored by the adversary (colluding with the miner) with probability f, by an
honest author otherwise. An adversarial author can re-seal its block r times (r + 1 candidate
hashes) and keeps a hash whose draw misses the faked steps, if one of them does; it cannot predict
later honest blocks.

- honest baseline:  (1 - phi)^k
- v1, all k challenges from ONE block's hash; an adversary authoring that block gets r + 1 tries
  at the whole set:
      escape_v1 = (1 - f) (1 - phi)^k + f (1 - (1 - (1 - phi)^k)^(r + 1))
- v2, challenge i (i = 0..k-1) from the hash of its own block B+d+i, uniform over steps 1..n,
  distinct (a draw on an already challenged step is redrawn, from the same hash; one candidate).
  Per challenge the miss probability is q = (1 - f)(1 - phi) + f (1 - phi^(r + 1)), so
      escape_v2 ~= q^k        (the closed form ignores distinctness; the simulation keeps it).
  v2 is not below v1 for every r: at r = 1, v1 = p (1 + f (1 - p)) with p = (1 - phi)^k and
  v2 = p (1 + f phi)^k, and (1 + f phi)^k >= 1 + k f phi > 1 + f (1 - p) (Bernoulli), so v2 leaks
  more for k >= 2, f > 0. As r grows, v1 -> f + (1 - f) p and v2 -> (1 - (1 - f) phi)^k, convex in
  f with the same ends (p at f = 0, 1 at f = 1), so below v1's chord for 0 < f < 1, k >= 2. A
  table prints, per f and k, the smallest r from which v2 <= v1.

Committee capture. Bonded verifiers hold stake; the adversary holds a share s of the total, split
over one or several accounts of equal stake, against H honest accounts of equal stake. A committee
of N seats is drawn stake-weighted WITHOUT replacement among the eligible accounts: draw an integer
x uniform in [0, W) (W the remaining accounts' total stake), seat the account whose cumulative
stake range holds x, remove it, repeat. A committee is never larger than the eligible accounts
(N is capped at their number). The adversary captures a challenge if it holds at least half of
the seats (2 * seats >= N: the cluster share 1/2 quorum). The exact value of that draw for equal
stakes within each side is a small dynamic programme over (adversary seats, honest seats): the
next seat is adversarial with probability a_left * w_a / (a_left * w_a + h_left * w_h).

A table prints the exact value by the number of equal adversarial accounts (1 account can hold at
most one seat; many small ones approach a draw in which the adversary's stake never leaves).

For reference the same draw WITH replacement (a seat per draw, an account may hold several):
the adversary's seats are Binomial(N, s) however its stake is split, so
      P(capture) = sum_{j >= N/2} C(N, j) s^j (1 - s)^(N - j).

Escalation: three rounds re-drawn independently with committees of N, 2N and 4N seats; the
probability that ALL three are captured is the product of the three rounds' probabilities (the
simulation draws the three rounds per trial).

    .venv/bin/python bench/protocol_bias.py [--phi 0.1] [--k 1,4,8] [--trials 100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time

F_VALUES = (0.0, 0.1, 1 / 3, 0.5)
R_VALUES = (0, 1, 10, 100)
S_VALUES = (0.1, 0.2, 1 / 3, 0.45)
N_VALUES = (5, 9, 17)
HONEST_STAKE = 10**9  # stake units of one honest account (integers: the draw is over integers)


# --- the challenge draw -----------------------------------------------------------------------------


def escape_honest(phi: float, k: int) -> float:
    """(1 - phi)^k: no adversarial block author."""
    return (1.0 - phi) ** k


def escape_v1_closed(f: float, r: int, phi: float, k: int) -> float:
    """v1: all k challenges from one block; its adversarial author gets r + 1 tries at the set."""
    p = (1.0 - phi) ** k
    return (1.0 - f) * p + f * (1.0 - (1.0 - p) ** (r + 1))


def escape_v2_closed(f: float, r: int, phi: float, k: int) -> float:
    """v2: one block per challenge; q^k with q = (1 - f)(1 - phi) + f (1 - phi^(r + 1))."""
    q = (1.0 - f) * (1.0 - phi) + f * (1.0 - phi ** (r + 1))
    return q**k


def _check_draw_args(f: float, r: int, phi: float, k: int, steps: int, trials: int) -> int:
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"f (adversarial block share) must be in [0, 1], got {f}")
    if r < 0:
        raise ValueError(f"r (re-seals) must be >= 0, got {r}")
    if not 0.0 <= phi <= 1.0:
        raise ValueError(f"phi (faked share) must be in [0, 1], got {phi}")
    if not 1 <= k <= steps:
        raise ValueError(f"k (challenges) must be in [1, steps={steps}], got {k}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    return round(phi * steps)


def _distinct_step(rng: random.Random, steps: int, taken: set[int]) -> int:
    """A step in 1..steps not challenged yet (a duplicate is redrawn)."""
    while True:
        t = rng.randrange(steps) + 1
        if t not in taken:
            return t


def simulate_escape(design: str, f: float, r: int, phi: float, k: int, *, steps: int = 1000,
                    trials: int = 20000, rng: random.Random) -> float:
    """Share of `trials` runs of `steps` steps (m = round(phi * steps) faked: steps 1..m) whose k
    challenges all miss the faked steps, under design "v1" (one block) or "v2" (a block each)."""
    m = _check_draw_args(f, r, phi, k, steps, trials)
    tries = r + 1
    escapes = 0
    if design == "v1":
        for _ in range(trials):
            for _try in range(tries if rng.random() < f else 1):
                taken: set[int] = set()
                for _i in range(k):
                    t = _distinct_step(rng, steps, taken)
                    if t <= m:
                        break
                    taken.add(t)
                else:
                    escapes += 1
                    break
    elif design == "v2":
        for _ in range(trials):
            taken = set()
            for _i in range(k):
                for _try in range(tries if rng.random() < f else 1):
                    t = _distinct_step(rng, steps, taken)
                    if t > m:
                        break  # this candidate misses: the author keeps it (an honest one has no choice)
                else:
                    break  # every candidate lands on a faked step: caught
                taken.add(t)
            else:
                escapes += 1
    else:
        raise ValueError(f"design must be 'v1' or 'v2', got {design!r}")
    return escapes / trials


def escape_rows(phi: float, ks, steps: int, trials: int, rng: random.Random) -> list[dict]:
    rows = []
    for k in ks:
        for f in F_VALUES:
            for r in R_VALUES:
                rows.append({
                    "f": f, "r": r, "k": k,
                    "honest": escape_honest(phi, k),
                    "v1_sim": simulate_escape("v1", f, r, phi, k, steps=steps, trials=trials, rng=rng),
                    "v1_closed": escape_v1_closed(f, r, phi, k),
                    "v2_sim": simulate_escape("v2", f, r, phi, k, steps=steps, trials=trials, rng=rng),
                    "v2_closed": escape_v2_closed(f, r, phi, k),
                })
    return rows


def crossover_r(f: float, phi: float, k: int, r_max: int = 100_000) -> int | None:
    """Smallest r >= 1 from which escape_v2_closed <= escape_v1_closed (both are monotone in r),
    None if not reached by r_max."""
    if escape_v2_closed(f, r_max, phi, k) > escape_v1_closed(f, r_max, phi, k):
        return None
    lo, hi = 1, r_max
    while lo < hi:
        mid = (lo + hi) // 2
        if escape_v2_closed(f, mid, phi, k) <= escape_v1_closed(f, mid, phi, k):
            hi = mid
        else:
            lo = mid + 1
    return lo


def crossover_rows(phi: float, ks) -> list[dict]:
    rows = []
    for k in ks:
        for f in F_VALUES[1:]:
            p = (1.0 - phi) ** k
            rows.append({"f": f, "k": k, "v1_r1": escape_v1_closed(f, 1, phi, k),
                         "v2_r1": escape_v2_closed(f, 1, phi, k), "crossover_r": crossover_r(f, phi, k),
                         "v1_limit": f + (1.0 - f) * p, "v2_limit": (1.0 - (1.0 - f) * phi) ** k})
    return rows


# --- committee capture ------------------------------------------------------------------------------


def stakes(s: float, adversary_accounts: int, honest_accounts: int = 20,
           honest_stake: int = HONEST_STAKE) -> tuple[list[int], int]:
    """(integer stakes of all accounts, number of adversarial ones first): the adversary's share s
    of the total split equally over `adversary_accounts` accounts."""
    if not 0.0 < s < 1.0:
        raise ValueError(f"s (adversary stake share) must be in (0, 1), got {s}")
    if adversary_accounts < 1 or honest_accounts < 1:
        raise ValueError(f"need >= 1 adversarial and >= 1 honest account, got {adversary_accounts}, "
                         f"{honest_accounts}")
    each = round(honest_accounts * honest_stake * s / (1.0 - s) / adversary_accounts)
    if each < 1:
        raise ValueError(f"s = {s} over {adversary_accounts} accounts leaves an account no stake")
    return [each] * adversary_accounts + [honest_stake] * honest_accounts, adversary_accounts


def draw_committee(rng: random.Random, weights: list[int], seats: int, *, replace: bool = False) -> list[int]:
    """Indices of `seats` accounts drawn stake-weighted: x uniform in [0, W), the account whose
    cumulative range holds x; without replacement (the default) it leaves the draw."""
    if seats > len(weights) and not replace:
        raise ValueError(f"a committee of {seats} seats from {len(weights)} accounts without replacement")
    left = list(range(len(weights)))
    w = list(weights)
    total = sum(w)
    out = []
    for _ in range(seats):
        x = rng.randrange(total)
        j = 0
        while x >= w[j]:
            x -= w[j]
            j += 1
        out.append(left[j])
        if not replace:
            total -= w[j]
            del w[j], left[j]
    return out


def capture_probability(weights: list[int], adversarial: int, seats: int, *, trials: int,
                        rng: random.Random, replace: bool = False) -> float:
    """Share of `trials` committees of `seats` (capped at the accounts without replacement) in
    which the accounts 0..adversarial-1 hold at least half of the seats."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    n = seats if replace else min(seats, len(weights))
    hits = 0
    for _ in range(trials):
        adv = sum(1 for i in draw_committee(rng, weights, n, replace=replace) if i < adversarial)
        hits += 2 * adv >= n
    return hits / trials


def capture_exact(adversary_accounts: int, adversary_stake: int, honest_accounts: int, honest_stake: int,
                  seats: int) -> float:
    """Exact P(capture) of the draw without replacement, equal stakes within each side."""
    n = min(seats, adversary_accounts + honest_accounts)
    dist = {0: 1.0}  # adversarial seats so far -> probability, after j seats
    for j in range(n):
        nxt: dict[int, float] = {}
        for a, p in dist.items():
            al, hl = adversary_accounts - a, honest_accounts - (j - a)
            wa, wh = al * adversary_stake, hl * honest_stake
            pa = wa / (wa + wh)
            if pa > 0:
                nxt[a + 1] = nxt.get(a + 1, 0.0) + p * pa
            if pa < 1:
                nxt[a] = nxt.get(a, 0.0) + p * (1.0 - pa)
        dist = nxt
    return sum(p for a, p in dist.items() if 2 * a >= n)


def capture_with_replacement(s: float, seats: int) -> float:
    """P(Binomial(seats, s) >= seats / 2): the draw with replacement, for any split of the stake."""
    return sum(math.comb(seats, j) * s**j * (1.0 - s) ** (seats - j)
               for j in range((seats + 1) // 2, seats + 1))


def escalation_probability(weights: list[int], adversarial: int, sizes, *, trials: int,
                           rng: random.Random) -> float:
    """Share of `trials` in which every round (an independent committee of each size) is captured."""
    hits = 0
    for _ in range(trials):
        for seats in sizes:
            n = min(seats, len(weights))
            adv = sum(1 for i in draw_committee(rng, weights, n) if i < adversarial)
            if 2 * adv < n:
                break
        else:
            hits += 1
    return hits / trials


SPLITS = (1, 2, 5, 10, 100, 1000)


def split_rows(honest_accounts: int) -> list[dict]:
    """Exact P(capture) without replacement by the number of equal adversarial accounts."""
    rows = []
    for s in S_VALUES:
        for n in N_VALUES:
            row = {"s": s, "N": n}
            for m in SPLITS:
                w, _ = stakes(s, m, honest_accounts)
                row[str(m)] = capture_exact(m, w[0], honest_accounts, HONEST_STAKE, n)
            row["with_replacement"] = capture_with_replacement(s, n)
            rows.append(row)
    return rows


def committee_rows(sybils: int, honest_accounts: int, trials: int, rng: random.Random) -> tuple[list, list]:
    rows, esc = [], []
    for s in S_VALUES:
        w1, a1 = stakes(s, 1, honest_accounts)
        ws, as_ = stakes(s, sybils, honest_accounts)
        for n in N_VALUES:
            rows.append({
                "s": s, "N": n, "seats": min(n, len(ws)),
                "one_sim": capture_probability(w1, a1, n, trials=trials, rng=rng),
                "one_exact": capture_exact(1, w1[0], honest_accounts, HONEST_STAKE, n),
                "split_sim": capture_probability(ws, as_, n, trials=trials, rng=rng),
                "split_exact": capture_exact(sybils, ws[0], honest_accounts, HONEST_STAKE, n),
                "with_replacement": capture_with_replacement(s, n),
            })
            sizes = (n, 2 * n, 4 * n)
            esc.append(
                {
                    "s": s,
                    "N": n,
                    "seats_one": [min(x, len(w1)) for x in sizes],
                    "seats_split": [min(x, len(ws)) for x in sizes],
                    "one_exact": math.prod(
                        capture_exact(1, w1[0], honest_accounts, HONEST_STAKE, x) for x in sizes
                    ),
                    "split_sim": escalation_probability(ws, as_, sizes, trials=trials, rng=rng),
                    "split_exact": math.prod(
                        capture_exact(sybils, ws[0], honest_accounts, HONEST_STAKE, x) for x in sizes
                    ),
                    "with_replacement": math.prod(capture_with_replacement(s, x) for x in sizes),
                }
            )
    return rows, esc


# --- printing ---------------------------------------------------------------------------------------


def _fmt(x) -> str:
    if isinstance(x, float):
        if x == 0.0:
            return "0"
        return f"{x:.4f}" if x >= 1e-3 else f"{x:.2e}"
    return str(x)


def _share(x: float) -> str:
    return "1/3" if abs(x - 1 / 3) < 1e-12 else f"{x:g}"


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phi", type=float, default=0.1, help="share of the run's steps the miner faked")
    ap.add_argument("--k", default="1,4,8", help="comma-separated challenges per run")
    ap.add_argument("--steps", type=int, default=1000, help="steps n of a run")
    ap.add_argument("--trials", type=int, default=100_000, help="Monte-Carlo trials per challenge-draw cell")
    ap.add_argument(
        "--committee-trials", type=int, default=20_000, help="Monte-Carlo trials per committee cell"
    )
    ap.add_argument("--sybils", type=int, default=10, help="accounts the adversary splits its stake over")
    ap.add_argument("--honest-accounts", type=int, default=20, help="honest verifier accounts, equal stake")
    ap.add_argument("--seed", type=int, default=1, help="seed of random.Random")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    a = ap.parse_args(argv)
    try:
        ks = [int(x) for x in a.k.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--k must be comma-separated integers, got {a.k!r}")
    if not ks or min(ks) < 1 or max(ks) > a.steps:
        ap.error(f"--k values must be in [1, --steps={a.steps}], got {a.k!r}")
    if not 0.0 <= a.phi <= 1.0:
        ap.error(f"--phi must be in [0, 1], got {a.phi}")
    if min(a.trials, a.committee_trials, a.sybils, a.honest_accounts) < 1:
        ap.error("--trials, --committee-trials, --sybils and --honest-accounts must be positive")

    rng = random.Random(a.seed)
    t0 = time.perf_counter()
    esc = escape_rows(a.phi, ks, a.steps, a.trials, rng)
    cross = crossover_rows(a.phi, [k for k in ks if k >= 2])
    com, escal = committee_rows(a.sybils, a.honest_accounts, a.committee_trials, rng)
    splits = split_rows(a.honest_accounts)
    elapsed = time.perf_counter() - t0
    res = {
        "params": {
            "phi": a.phi,
            "faked_steps": round(a.phi * a.steps),
            "steps": a.steps,
            "k": ks,
            "trials": a.trials,
            "committee_trials": a.committee_trials,
            "sybils": a.sybils,
            "honest_accounts": a.honest_accounts,
            "honest_stake": HONEST_STAKE,
            "seed": a.seed,
        },
        "escape": esc,
        "crossover": cross,
        "committee": com,
        "splits": splits,
        "escalation": escal,
        "seconds": round(elapsed, 2),
    }
    if a.json:
        print(json.dumps(res))
        return 0

    se = 0.5 / math.sqrt(a.trials)
    print(f"Escape probability: a run of {a.steps} steps, {res['params']['faked_steps']} faked "
          f"(phi = {a.phi:g}), {a.trials} trials per cell (standard error <= {se:.4f}), seed {a.seed}.")
    print()
    print(
        markdown(
            ["f", "r", "k", "honest (1-phi)^k", "v1 simulated", "v1 closed", "v2 simulated", "v2 closed"],
            [
                [
                    _share(x["f"]),
                    str(x["r"]),
                    str(x["k"]),
                    x["honest"],
                    x["v1_sim"],
                    x["v1_closed"],
                    x["v2_sim"],
                    x["v2_closed"],
                ]
                for x in esc
            ],
        )
    )
    print()
    if cross:
        print(f"v2 against v1 in closed form (phi = {a.phi:g}): escape at r = 1, the smallest r from which "
              f"v2 <= v1, and the limits as r grows (v1: f + (1-f)(1-phi)^k, v2: (1-(1-f)phi)^k).")
        print()
        print(markdown(["f", "k", "v1 at r=1", "v2 at r=1", "v2 <= v1 from r", "v1 limit", "v2 limit"],
                       [[_share(x["f"]), str(x["k"]), x["v1_r1"], x["v2_r1"],
                         "never" if x["crossover_r"] is None else str(x["crossover_r"]),
                         x["v1_limit"], x["v2_limit"]] for x in cross]))
        print()
    cse = 0.5 / math.sqrt(a.committee_trials)
    print(f"Committee capture (>= half the seats): {a.honest_accounts} honest accounts of equal stake, the "
          f"adversary's share s as 1 account or as {a.sybils} equal accounts, drawn without replacement; "
          f"{a.committee_trials} trials per cell (standard error <= {cse:.4f}). Seats are capped at the "
          f"accounts eligible ({a.honest_accounts + 1} with 1 adversarial account, "
          f"{a.honest_accounts + a.sybils} with {a.sybils}).")
    print()
    print(
        markdown(
            [
                "s",
                "N",
                "1 account sim",
                "1 account exact",
                f"{a.sybils} accounts sim",
                f"{a.sybils} accounts exact",
                "with replacement (any split)",
            ],
            [
                [
                    _share(x["s"]),
                    str(x["N"]),
                    x["one_sim"],
                    x["one_exact"],
                    x["split_sim"],
                    x["split_exact"],
                    x["with_replacement"],
                ]
                for x in com
            ],
        )
    )
    print()
    print(f"Capture by the number of equal adversarial accounts, exact, without replacement "
          f"({a.honest_accounts} honest accounts; seats capped at the accounts eligible).")
    print()
    print(markdown(["s", "N"] + [f"{m} account{'s' if m > 1 else ''}" for m in SPLITS] + ["with replacement"],
                   [[_share(x["s"]), str(x["N"])] + [x[str(m)] for m in SPLITS] + [x["with_replacement"]]
                    for x in splits]))
    print()
    print(f"Escalation: all three rounds captured, committees of N, 2N, 4N seats re-drawn independently "
          f"(capped at the eligible accounts); {a.committee_trials} trials per cell.")
    print()
    print(markdown(["s", "N", f"seats ({a.sybils} accounts)", "1 account exact", f"{a.sybils} accounts sim",
                    f"{a.sybils} accounts exact", "with replacement (any split)"],
                   [[_share(x["s"]), str(x["N"]), "/".join(map(str, x["seats_split"])), x["one_exact"],
                     x["split_sim"], x["split_exact"], x["with_replacement"]] for x in escal]))
    print()
    print(f"({elapsed:.1f} s)", file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
