"""AdamW and SGD with momentum in exact-v1 arithmetic, and global-norm gradient clipping.

The learning rate of step t comes from the spec's schedule (oracle.schedule); weight decay is
masked by parameter role (DECAYING_ROLES).

Every line of an update is one IEEE float32 basic operation on tensors (no fused or scaled adds,
no division by a Python scalar); hyperparameters become float32 tensors once, after the scalar
work below is done in binary64 by a fixed rule. The order is normative: docs/exact-v1.md,
"Optimizer order of operations".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from commitments.spec import OptimizerSpec
from oracle.exact import kernels
from oracle.schedule import lr_at

CLIP_EPS = 1e-6  # added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does
MOMENTS = {"adamw": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum",)}


class OptimError(ValueError):
    """Optimizer input that cannot be used, with the reason."""


def moment_names(opt: OptimizerSpec) -> tuple[str, ...]:
    return MOMENTS[opt.kind]


# Parameter roles a model declares (oracle.models.ParamSpec.role) and whether weight decay
# applies: to the weights of matrix products and to embedding tables, never to biases or to the
# gains of layer and RMS norms (the nanoGPT and Llama recipes).
DECAYING_ROLES = {"matrix": True, "embedding": True, "bias": False, "norm": False}


def decays(role: str | None, shape: tuple[int, ...]) -> bool:
    """Whether weight decay applies to a parameter of this role; a parameter whose model declares
    no role (None) decays when it has two or more dimensions (for every declared role of the
    models here the two rules agree)."""
    if role is None:
        return len(shape) >= 2
    if role not in DECAYING_ROLES:
        raise OptimError(f"unknown parameter role {role!r}; expected one of {sorted(DECAYING_ROLES)}")
    return DECAYING_ROLES[role]


def pow_int(x: float, n: int) -> float:
    """x**n in binary64 by left-to-right square-and-multiply (platform pow() is not portable)."""
    if n < 0:
        raise OptimError(f"negative power {n}")
    r = 1.0
    for bit in bin(n)[2:]:
        r = r * r
        if bit == "1":
            r = r * x
    return r


@dataclass(frozen=True)
class Hyper:
    """float32 constant tensors of one step, derived from the spec in binary64 (see module doc)."""

    lr: torch.Tensor
    b1: torch.Tensor
    b2: torch.Tensor
    c1: torch.Tensor  # 1 - beta1
    c2: torch.Tensor  # 1 - beta2
    eps: torch.Tensor
    decay: torch.Tensor  # AdamW: 1 - lr*wd
    wd: torch.Tensor  # SGD: coupled weight decay
    mu: torch.Tensor  # SGD momentum
    step_size: torch.Tensor  # AdamW: lr / (1 - beta1^t)
    sqrt_bc2: torch.Tensor  # AdamW: sqrt(1 - beta2^t)
    has_wd: bool

    @classmethod
    def of(cls, opt: OptimizerSpec, t: int, device) -> Hyper:
        if not isinstance(t, int) or t < 1:
            raise OptimError(f"optimizer step must be >= 1, got {t!r}")

        def f32(v: float) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.float32, device=device)

        lr = lr_at(opt, t)  # binary64; the spec's lr itself under a constant schedule
        bc1 = 1.0 - pow_int(opt.beta1, t)
        bc2 = 1.0 - pow_int(opt.beta2, t)
        return cls(
            lr=f32(lr), b1=f32(opt.beta1), b2=f32(opt.beta2),
            c1=f32(1.0 - opt.beta1), c2=f32(1.0 - opt.beta2), eps=f32(opt.eps),
            decay=f32(1.0 - lr * opt.weight_decay), wd=f32(opt.weight_decay),
            mu=f32(opt.momentum), step_size=f32(lr / bc1), sqrt_bc2=f32(math.sqrt(bc2)),
            has_wd=opt.weight_decay > 0.0,
        )


def _compiled(hp: Hyper, *ts: torch.Tensor) -> bool:
    """Whether the kernels of oracle.exact.kernels may run this update: CPU float32 contiguous
    tensors of one shape, none requiring grad (the eager code would record a graph); the eager code
    below is the definition and runs everywhere else."""
    if not kernels.enabled() or hp.lr.device.type != "cpu":
        return False
    shape = ts[0].shape
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == shape
               and t.is_contiguous() for t in ts):
        return False
    return not any(t.requires_grad for t in ts)


def adamw(p, g, m, v, hp: Hyper, decay: bool):
    """One AdamW update of one tensor; returns (p, m, v)."""
    if _compiled(hp, p, g, m, v):
        out = kernels.adamw(p, g, m, v, hp, decay)
        if out is not None:  # else a NaN: its bytes are the eager code's
            return out
    if decay and hp.has_wd:
        p = p * hp.decay
    m = hp.b1 * m + hp.c1 * g
    v = hp.b2 * v + hp.c2 * (g * g)
    denom = kernels.sqrt(v) / hp.sqrt_bc2 + hp.eps  # correctly rounded (stock torch.sqrt is not)
    u = (m / denom) * hp.step_size
    return p - u, m, v


def sgd(p, g, buf, hp: Hyper, decay: bool):
    """One SGD-with-momentum update (torch semantics, dampening 0); returns (p, buf)."""
    if _compiled(hp, p, g, buf):
        out = kernels.sgd(p, g, buf, hp, decay)
        if out is not None:
            return out
    if decay and hp.has_wd:
        g = g + hp.wd * p
    buf = hp.mu * buf + g
    return p - hp.lr * buf, buf


def clip(ops, grads: list[torch.Tensor], max_norm: float, *,
         owned: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Global-norm clipping over `grads` in canonical order; returns (grads, norm).

    `owned`: the caller hands the gradients over (it uses only the returned list), so they are
    scaled in place: the same IEEE products, without a second copy of every gradient.

    norm = sqrt(sum_of_squares(grads)) with the sum exact; coef = min(max_norm / (norm + 1e-6), 1);
    every gradient is multiplied by coef (a no-op when coef is 1). A non-finite norm sets coef to NaN,
    so every gradient and then every parameter becomes NaN: a broken step is visible in the state."""
    norm = kernels.sqrt(ops.sum_of_squares(grads).to(torch.float32))
    if max_norm <= 0.0:
        return grads, norm
    dev = norm.device
    coef = torch.tensor(max_norm, dtype=torch.float32, device=dev) / (
        norm + torch.tensor(CLIP_EPS, dtype=torch.float32, device=dev))
    one = torch.ones((), dtype=torch.float32, device=dev)
    nan = torch.full((), float("nan"), dtype=torch.float32, device=dev)
    # a selection, not torch.minimum: its sign of zero depends on the layout (docs/exact-v1.md §11)
    coef = torch.where(torch.isfinite(norm), torch.where(coef < one, coef, one), nan)
    if kernels.enabled() and dev.type == "cpu" and bool(coef == one):
        # coef is exactly 1 only when the norm is finite, so every gradient is finite (the sum of
        # squares is NaN or inf otherwise), and g * 1 is g bit for bit for every finite float32
        # (no flush-to-zero: profiles.arithmetic_flags): the same values, without the pass
        return list(grads), norm
    if owned:
        return [g.mul_(coef) if g.is_contiguous() else g * coef for g in grads], norm
    return [g * coef for g in grads], norm


def update(opt: OptimizerSpec, t: int, names: list[str], params: list[torch.Tensor],
           grads: list[torch.Tensor], moments: dict[str, list[torch.Tensor]],
           roles: list[str | None] | None = None):
    """Apply one optimizer step to every tensor in canonical order; `roles` are the parameters'
    roles (see DECAYING_ROLES; None: none declared).

    Returns (new params, new moments) as lists in the same order; nothing is modified in place."""
    if not (len(names) == len(params) == len(grads)):
        raise OptimError("names, params and grads differ in length")
    if roles is None:
        roles = [None] * len(names)
    if len(roles) != len(names):
        raise OptimError(f"{len(roles)} roles for {len(names)} parameters")
    want = moment_names(opt)
    if tuple(moments) != want:
        raise OptimError(f"{opt.kind} needs moments {want}, got {tuple(moments)}")
    hp = Hyper.of(opt, t, params[0].device if params else None)
    new_p: list[torch.Tensor] = []
    new_m: dict[str, list[torch.Tensor]] = {k: [] for k in want}
    for i, (p, g, role) in enumerate(zip(params, grads, roles, strict=True)):
        d = decays(role, tuple(p.shape))
        if opt.kind == "adamw":
            p2, m2, v2 = adamw(p, g, moments["exp_avg"][i], moments["exp_avg_sq"][i], hp, d)
            new_m["exp_avg"].append(m2)
            new_m["exp_avg_sq"].append(v2)
        else:
            p2, b2 = sgd(p, g, moments["momentum"][i], hp, d)
            new_m["momentum"].append(b2)
        new_p.append(p2)
    return new_p, new_m
