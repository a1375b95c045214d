"""Secondary checks on a run's committed loss sequence: cheap signals computed before any replay.

Pure functions over the list of per-step losses (step 1..T, from the step leaves). They never
decide a verdict (the replay does); they flag sequences no honest optimiser produces.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class LossCheckConfig:
    """Thresholds. Defaults are lenient: an honest noisy run must pass them all."""

    # decrease within noise: mean of the last `window` losses may exceed the first window's
    # mean by at most `noise_sigmas` standard deviations of the step-to-step differences.
    window: int = 3
    noise_sigmas: float = 3.0
    # plausible rate: no single step may divide the loss by more than this factor.
    max_drop_factor: float = 4.0
    # plateau: this many consecutive bit-identical losses is not what SGD on fresh batches gives.
    plateau_steps: int = 4
    # backward jumps: a step may raise the loss by at most this factor of the previous loss.
    max_jump_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.window < 1 or self.plateau_steps < 2:
            raise ValueError("window must be >= 1 and plateau_steps >= 2")
        for name in ("noise_sigmas", "max_drop_factor", "max_jump_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"loss check threshold {name} must be a positive number, got {v!r}")
        if self.max_drop_factor <= 1 or self.max_jump_factor <= 1:
            raise ValueError("max_drop_factor and max_jump_factor must be above 1")


@dataclass(frozen=True)
class Finding:
    check: str  # non_finite | no_decrease | implausible_rate | plateau | backward_jump
    step: int  # the step (1-based) the finding points at
    detail: str


@dataclass(frozen=True)
class LossCheckReport:
    steps: int
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {"steps": self.steps, "ok": self.ok, "findings": [asdict(f) for f in self.findings]}


def check_non_finite(losses: Sequence[float]) -> list[Finding]:
    return [Finding("non_finite", t, f"loss at step {t} is {x!r}")
            for t, x in enumerate(losses, start=1) if not math.isfinite(x)]


def check_decrease(losses: Sequence[float], *, window: int = 3, noise_sigmas: float = 3.0) -> list[Finding]:
    """Training must lower the loss, up to the noise the sequence itself shows."""
    xs = [float(x) for x in losses]
    if len(xs) < 2 * window or not all(math.isfinite(x) for x in xs):
        return []
    first, last = statistics.fmean(xs[:window]), statistics.fmean(xs[-window:])
    diffs = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    noise = statistics.pstdev(diffs) if len(diffs) > 1 else 0.0
    if last > first + noise_sigmas * noise:
        return [Finding("no_decrease", len(xs),
                        f"mean loss of the last {window} steps ({last:.4g}) exceeds the first {window} "
                        f"({first:.4g}) by more than {noise_sigmas} x noise ({noise:.3g})")]
    return []


def check_rate(losses: Sequence[float], *, max_drop_factor: float = 4.0) -> list[Finding]:
    """A loss that collapses in one step suggests a swapped-in, already-trained model."""
    out = []
    for t in range(2, len(losses) + 1):
        prev, cur = float(losses[t - 2]), float(losses[t - 1])
        if (
            math.isfinite(prev)
            and math.isfinite(cur)
            and prev > 0
            and (cur <= 0 or prev / cur > max_drop_factor)
        ):
            out.append(
                Finding(
                    "implausible_rate",
                    t,
                    f"loss fell from {prev:.4g} to {cur:.4g} in one step (limit: /{max_drop_factor:g})",
                )
            )
    return out


def check_plateau(losses: Sequence[float], *, plateau_steps: int = 4) -> list[Finding]:
    """Runs of identical losses: fresh batches every step make exact repeats implausible."""
    out = []
    run_start = 0
    for i in range(1, len(losses) + 1):
        if i < len(losses) and losses[i] == losses[run_start]:
            continue
        length = i - run_start
        if length >= plateau_steps:
            out.append(Finding("plateau", run_start + 1,
                               f"{length} consecutive steps ({run_start + 1}..{i}) report the same loss "
                               f"{float(losses[run_start]):.6g}"))
        run_start = i
    return out


def check_backward_jumps(losses: Sequence[float], *, max_jump_factor: float = 2.0) -> list[Finding]:
    """Steps that multiply the loss: a state rolled back or swapped between steps."""
    out = []
    for t in range(2, len(losses) + 1):
        prev, cur = float(losses[t - 2]), float(losses[t - 1])
        if math.isfinite(prev) and math.isfinite(cur) and prev > 0 and cur > prev * max_jump_factor:
            out.append(Finding("backward_jump", t,
                               f"loss rose from {prev:.4g} to {cur:.4g} (limit: x{max_jump_factor:g})"))
    return out


def run_loss_checks(losses: Sequence[float], config: LossCheckConfig | None = None) -> LossCheckReport:
    """All checks over the losses of steps 1..T (leaf 0 carries no loss and is left out)."""
    c = config or LossCheckConfig()
    xs = [float(x) for x in losses]
    findings = (check_non_finite(xs)
                + check_decrease(xs, window=c.window, noise_sigmas=c.noise_sigmas)
                + check_rate(xs, max_drop_factor=c.max_drop_factor)
                + check_plateau(xs, plateau_steps=c.plateau_steps)
                + check_backward_jumps(xs, max_jump_factor=c.max_jump_factor))
    return LossCheckReport(len(xs), tuple(sorted(findings, key=lambda f: (f.step, f.check))))


def losses_from_leaves(leaves: Sequence[bytes]) -> list[float]:
    """The per-step losses (steps 1..T) of the leaf list 0..T, checking each leaf's step index."""
    from commitments.leaves import parse_step_leaf

    out = []
    for i, raw in enumerate(leaves):
        leaf = parse_step_leaf(raw)
        if leaf.t != i:
            raise ValueError(f"leaf at index {i} says step {leaf.t}")
        if i:
            out.append(leaf.loss)
    return out


__all__ = [
    "Finding", "LossCheckConfig", "LossCheckReport", "check_backward_jumps", "check_decrease",
    "check_non_finite", "check_plateau", "check_rate", "losses_from_leaves", "run_loss_checks",
]
