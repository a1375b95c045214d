"""The exact-v1 ops: torch autograd Functions whose forward and backward are both exact-v1.

Float32 tensors at every boundary; reductions exact (oracle.exact.quant), transcendentals by the
float64 algorithms of oracle.exact.transcendental (or the bit-identical numba kernels on CPU).
Device-agnostic torch: the same code runs on CUDA. The rules are in docs/exact-v1.md.
"""

from __future__ import annotations

import builtins
import math

import torch

from oracle.exact import kernels
from oracle.exact import sqrt as xsqrt
from oracle.exact import transcendental as tx
from oracle.exact.accumulate import Fold, active
from oracle.exact.bf16 import round_bf16
from oracle.exact.gemm import exact_matmul, matmul_parts
from oracle.exact.quant import (
    F32,
    F64,
    ExactError,
    canon_nan,
    exact_sum64,
    pow2,
    quantise,
    round_scaled_int_to_f32,
    sum_bits,
)

NAME = "exact-v1"
VARIANTS = ("single", "hilo")
SEQ_CHUNK_BYTES = 1 << 28  # per-sequence float64 gradient partials are computed this much at a time


# --- argument checks -------------------------------------------------------------------------


def _f32(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ExactError(f"{name}: expected a float32 tensor, got {type(t).__name__}")
    if t.dtype != F32:
        raise ExactError(f"{name}: expected float32, got {t.dtype}")
    return t


def _variant(v: str) -> str:
    if v not in VARIANTS:
        raise ExactError(f"matmul variant must be 'single' or 'hilo', got {v!r}")
    return v


def _const(v: float, like: torch.Tensor, dtype=F64) -> torch.Tensor:
    return torch.full((), v, dtype=dtype, device=like.device)


def _use_kernels(*ts: torch.Tensor) -> bool:
    return kernels.enabled() and all(t.device.type == "cpu" for t in ts)


def _sequences(x: torch.Tensor, feature_dims: int = 1) -> torch.Tensor:
    """View x as [sequences, tokens, features...]: dim 0 indexes sequences when x has a token
    axis besides it; a tensor with only one leading dim is a single sequence."""
    lead = x.dim() - feature_dims
    feat = x.shape[lead:]
    if lead >= 2:
        return x.reshape(x.shape[0], -1, *feat)
    return x.reshape(1, -1, *feat)


def _param_grad(param: torch.Tensor, fill) -> torch.Tensor | None:
    """Route a token-axis gradient: to the open accumulator when it owns `param` (returns None),
    else fold locally and return the float32 gradient. `fill(fold)` adds the per-sequence parts."""
    acc = active()
    if acc is not None and acc.owns(param):
        acc.deposit_site(param, fill)
        return None
    fold = Fold(param.shape, param.device)
    fill(fold)
    return fold.result()


def _seq_sums(v3: torch.Tensor) -> torch.Tensor:
    """Per-sequence exact sums along the token axis of v3 [B, T, C]: float64 [B, C]."""
    if _use_kernels(v3) and v3.dim() == 3:
        return kernels.seq_sums(v3)
    return exact_sum64(v3, dim=1)


def _seq_chunks(n_seq: int, per_seq_elems: int):
    step = max(1, SEQ_CHUNK_BYTES // max(1, per_seq_elems * 8))
    for lo in range(0, n_seq, step):
        yield lo, min(n_seq, lo + step)


# --- linear and matmul -----------------------------------------------------------------------


def _bf16_operands(bf16: bool, *ts):
    """bf16-mixed: the operands of a matrix product rounded to bfloat16 (None stays None)."""
    return tuple(round_bf16(t) if bf16 and t is not None else t for t in ts)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, variant, bf16=False):
        ctx.variant = variant
        ctx.params = (w, b)  # the objects themselves: the accumulator knows parameters by identity
        ctx.has_b = b is not None
        # bf16-mixed rounds x, w and b and then the output; the gradient passes each rounding
        # unchanged (float32), and the backward products use the rounded x and w.
        x, w, b = _bf16_operands(bf16, x, w, b)
        ctx.save_for_backward(x, w)
        y = exact_matmul(x.reshape(-1, x.shape[-1]), w.t(), variant)
        if b is not None:
            y = canon_nan(y + b)
        y = y.reshape(*x.shape[:-1], w.shape[0])
        return round_bf16(y) if bf16 else y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        w_obj, b = ctx.params
        variant = ctx.variant
        g = g.contiguous()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = exact_matmul(g.reshape(-1, g.shape[-1]), w, variant).reshape(x.shape)
        g3, x3 = _sequences(g), _sequences(x)
        if ctx.needs_input_grad[1]:
            def fill_w(fold):
                for lo, hi in _seq_chunks(g3.shape[0], w.numel()):
                    ph, pl = matmul_parts(g3[lo:hi].transpose(1, 2), x3[lo:hi], variant)
                    if pl is not None:  # each sequence's exact value is hi + lo: add both, in order
                        ph = torch.stack([ph, pl], dim=1).reshape(-1, *ph.shape[1:])
                    fold.add_many(ph, owned=True)  # ph is this call's own result
            gw = _param_grad(w_obj, fill_w)
        if ctx.has_b and ctx.needs_input_grad[2]:
            per_seq = _seq_sums(g3)

            gb = _param_grad(b, lambda fold: fold.add_many(per_seq))
        return gx, gw, gb, None, None


def linear(x, weight, bias=None, *, variant="single", bf16=False):
    """x[..., in] @ weight[out, in].T (+ bias): the product exact and rounded once, then a float32
    add of the bias. Weight and bias gradients contract the token axis per sequence (dim 0 of a
    >= 3-d x) and reach an open ExactGradAccumulator; see oracle.exact.accumulate. `bf16`
    (dtype bf16-mixed): x, weight and bias rounded to bfloat16 first, the result after."""
    _f32("linear x", x)
    _f32("linear weight", weight)
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ExactError(f"linear: x[..., {x.shape[-1] if x.dim() else '?'}] does not match "
                         f"weight{list(weight.shape)} (expected [out, in])")
    if bias is not None:
        _f32("linear bias", bias)
        if tuple(bias.shape) != (weight.shape[0],):
            raise ExactError(f"linear: bias shape {list(bias.shape)} != [{weight.shape[0]}]")
    return _Linear.apply(x, weight, bias, _variant(variant), bool(bf16))


class _MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, variant, bf16=False):
        ctx.variant = variant
        a, b = _bf16_operands(bf16, a, b)
        ctx.save_for_backward(a, b)
        y = exact_matmul(a, b, variant)
        return round_bf16(y) if bf16 else y

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = exact_matmul(g, b.transpose(-2, -1), ctx.variant)
        if ctx.needs_input_grad[1]:
            gb = exact_matmul(a.transpose(-2, -1), g, ctx.variant)
        return ga, gb, None, None


def matmul(a, b, *, variant="single", bf16=False):
    """Batched a[..., m, k] @ b[..., k, n] with equal batch dims (attention); exact, rounded once.
    `bf16`: a and b rounded to bfloat16 first, the result after (as in linear)."""
    _f32("matmul a", a)
    _f32("matmul b", b)
    if a.dim() < 2 or b.dim() < 2 or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ExactError(
            f"matmul: shapes {list(a.shape)} @ {list(b.shape)} are not [..., m, k] @ [..., k, n] "
            f"with equal batch dims"
        )
    return _MatMul.apply(a, b, _variant(variant), bool(bf16))


# --- sums and means --------------------------------------------------------------------------


def _norm_dim(x, dim):
    if dim is None:
        return None
    if not isinstance(dim, int):
        raise ExactError(f"dim must be an int or None, got {dim!r}")
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ExactError(f"dim {dim} out of range for a {x.dim()}-d tensor")
    return dim % x.dim()


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim, mean):
        ctx.shape, ctx.dim, ctx.keepdim, ctx.mean = x.shape, dim, keepdim, mean
        s = exact_sum64(x, dim, keepdim)
        n = x.numel() if dim is None else x.shape[dim]
        ctx.n = n
        if mean:
            s = s / _const(float(n), x)
        return canon_nan(s.to(F32))

    @staticmethod
    def backward(ctx, g):
        if ctx.mean:
            g = canon_nan((g.to(F64) / _const(float(ctx.n), g)).to(F32))
        if ctx.dim is not None and not ctx.keepdim:
            g = g.unsqueeze(ctx.dim)
        return g.expand(ctx.shape).contiguous(), None, None, None


def sum(x, dim=None, keepdim=False):  # noqa: A001 - the op namespace mirrors torch
    """Exact sum (quantised to sum_bits(n), accumulated exactly, rounded once)."""
    _f32("sum x", x)
    return _Sum.apply(x, _norm_dim(x, dim), keepdim, False)


def mean(x, dim=None, keepdim=False):
    """fp32(S / n) with S the exact sum as float64 and the division in float64."""
    _f32("mean x", x)
    return _Sum.apply(x, _norm_dim(x, dim), keepdim, True)


# --- softmax family (eager definitions; the numba kernels equal them bit for bit) -------------


def softmax_rows_eager(x: torch.Tensor) -> torch.Tensor:
    m = torch.amax(x, dim=-1, keepdim=True)
    e = tx.exp_f64(x.to(F64) - m.to(F64))
    s = exact_sum64(e, -1, True)
    return canon_nan((e / s).to(F32))


def log_softmax_rows_eager(x: torch.Tensor) -> torch.Tensor:
    m = torch.amax(x, dim=-1, keepdim=True)
    z = x.to(F64) - m.to(F64)
    s = exact_sum64(tx.exp_f64(z), -1, True)
    return canon_nan((z - tx.log_f64(s)).to(F32))


def softmax_bwd_rows_eager(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    p64, g64 = p.to(F64), g.to(F64)
    d = exact_sum64(g64 * p64, -1, True)  # float32 products are exact in float64
    return canon_nan((p64 * (g64 - d)).to(F32))


def log_softmax_bwd_rows_eager(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    g64 = g.to(F64)
    gs = exact_sum64(g64, -1, True)
    return canon_nan((g64 - tx.exp_f64(y.to(F64)) * gs).to(F32))


def _rows(fn_eager, fn_kernel, *ts, dim):
    """Apply a row function along `dim` of same-shaped tensors (moved last, made contiguous)."""
    moved = [t.movedim(dim, -1).contiguous() for t in ts]
    fn = fn_kernel if _use_kernels(*moved) else fn_eager
    return fn(*moved).movedim(-1, dim)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        p = _rows(softmax_rows_eager, kernels.softmax_rows, x, dim=dim)
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return _rows(softmax_bwd_rows_eager, kernels.softmax_bwd_rows, p, g, dim=ctx.dim), None


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _rows(log_softmax_rows_eager, kernels.log_softmax_rows, x, dim=dim)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _rows(log_softmax_bwd_rows_eager, kernels.log_softmax_bwd_rows, y, g, dim=ctx.dim), None


def softmax(x, dim=-1):
    """p = fp32(e / S): e = exp(x - max) in float64, S the exact sum of e along the row."""
    _f32("softmax x", x)
    return _Softmax.apply(x, _norm_dim(x, dim))


def log_softmax(x, dim=-1):
    """fp32((x - max) - log S), S as in softmax; the subtraction in float64."""
    _f32("log_softmax x", x)
    return _LogSoftmax.apply(x, _norm_dim(x, dim))


# --- cross-entropy ---------------------------------------------------------------------------


def ce_rows_eager(x: torch.Tensor, t: torch.Tensor):
    """Per row: (loss float32, m float32, S float64) with loss = fp32(log S - (x_t - m))."""
    m = torch.amax(x, dim=-1, keepdim=True)
    z = x.to(F64) - m.to(F64)
    s = exact_sum64(tx.exp_f64(z), -1, True)
    zt = torch.gather(z, -1, t.unsqueeze(-1))
    loss = canon_nan((tx.log_f64(s) - zt).to(F32))
    return loss.squeeze(-1), m.squeeze(-1), s.squeeze(-1)


def ce_bwd_rows_eager(x, t, m, s, scale):
    """fp32(((p - onehot) * g) / total), p = e / S, with scale = (g, total) float64 scalars."""
    g64, total = scale
    e = tx.exp_f64(x.to(F64) - m.to(F64).unsqueeze(-1))
    p = e / s.unsqueeze(-1)
    onehot = torch.zeros_like(p).scatter_(-1, t.unsqueeze(-1), 1.0)
    return canon_nan((((p - onehot) * g64) / total).to(F32))


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, n_seq, total):
        x = logits.reshape(-1, logits.shape[-1]).contiguous()
        t = targets.reshape(-1)
        if _use_kernels(x):
            loss_rows, m, s = kernels.ce_rows(x, t)
        else:
            loss_rows, m, s = ce_rows_eager(x, t)
        per_seq = exact_sum64(loss_rows.reshape(n_seq, -1), dim=1)
        acc = active()
        if acc is not None:
            acc.deposit_loss(per_seq, total)
        fold = Fold((), x.device)
        fold.add_many(per_seq)
        out = canon_nan(((fold.hi + fold.lo) / _const(float(total), x)).to(F32))
        ctx.save_for_backward(x, t, m, s)
        ctx.total, ctx.shape = total, logits.shape
        return out

    @staticmethod
    def backward(ctx, g):
        x, t, m, s = ctx.saved_tensors
        scale = (g.to(F64), _const(float(ctx.total), x))
        if _use_kernels(x):
            gx = kernels.ce_bwd_rows(x, t, m, s, scale)
        else:
            gx = ce_bwd_rows_eager(x, t, m, s, scale)
        return gx.reshape(ctx.shape), None, None, None


def cross_entropy(logits, targets, *, total_count=None):
    """Mean token cross-entropy over logits[..., V] and int64 targets[...].

    Per-token losses fp32(log S - (x_t - max)) are summed exactly per sequence (dim 0 of a >= 3-d
    logits; a 2-d one is one sequence), folded in sequence order, and divided by `total_count`
    (default: the number of tokens here) in float64. Give every micro-batch of a step the step's
    token count as total_count; an open ExactGradAccumulator then yields the step's loss."""
    _f32("cross_entropy logits", logits)
    if not isinstance(targets, torch.Tensor) or targets.dtype != torch.int64:
        raise ExactError(f"cross_entropy targets must be an int64 tensor, got "
                         f"{getattr(targets, 'dtype', type(targets).__name__)}")
    if logits.dim() < 2 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ExactError(f"cross_entropy: targets shape {list(targets.shape)} must equal logits shape "
                         f"without its last dim {list(logits.shape[:-1])}")
    V = logits.shape[-1]
    if targets.numel():
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= V:
            raise ExactError(f"cross_entropy: target {lo if lo < 0 else hi} outside [0, {V})")
    n_seq = logits.shape[0] if logits.dim() >= 3 else 1
    total = targets.numel() if total_count is None else total_count
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise ExactError(f"cross_entropy total_count must be a positive int, got {total_count!r}")
    return _CrossEntropy.apply(logits, targets, n_seq, total)


# --- layer norm ------------------------------------------------------------------------------


def _ln_stats(x64: torch.Tensor, eps: float):
    C = x64.shape[-1]
    n = _const(float(C), x64)
    mu = exact_sum64(x64, -1, True) / n
    d = x64 - mu
    var = exact_sum64(d * d, -1, True) / n
    rstd = torch.div(_const(1.0, x64), xsqrt.sqrt64(var + _const(eps, x64)))
    return mu, rstd


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps):
        ctx.has_w, ctx.has_b = w is not None, b is not None
        ctx.params = (w, b)
        if _use_kernels(x):
            C = x.shape[-1]
            y, mu, rstd = kernels.layer_norm_rows(x.reshape(-1, C).contiguous(), w, b, eps)
            stat_shape = (*x.shape[:-1], 1)
            mu, rstd = mu.reshape(stat_shape), rstd.reshape(stat_shape)
            ctx.save_for_backward(x, mu, rstd)
            return y.reshape(x.shape)
        x64 = x.to(F64)
        mu, rstd = _ln_stats(x64, eps)
        xhat = (x64 - mu) * rstd
        y = xhat
        if w is not None:
            y = y * w.to(F64)
        if b is not None:
            y = y + b.to(F64)
        ctx.save_for_backward(x, mu, rstd)
        return canon_nan(y.to(F32))

    @staticmethod
    def backward(ctx, g):
        x, mu, rstd = ctx.saved_tensors
        w, b = ctx.params
        C = x.shape[-1]
        gw = gb = None
        if _use_kernels(x, g):
            gx, prod = kernels.layer_norm_bwd_rows(
                x.reshape(-1, C).contiguous(),
                g.reshape(-1, C).contiguous(),
                w,
                mu.reshape(-1, 1),
                rstd.reshape(-1, 1),
            )
            gx = gx.reshape(x.shape)
            prod = prod.reshape(x.shape)
        else:
            x64, g64 = x.to(F64), g.to(F64)
            xhat = (x64 - mu) * rstd
            n = _const(float(C), x64)
            gh = g64 * w.to(F64) if ctx.has_w else g64
            m1 = exact_sum64(gh, -1, True) / n
            m2 = exact_sum64(gh * xhat, -1, True) / n
            gx = canon_nan((rstd * ((gh - m1) - xhat * m2)).to(F32))
            prod = g64 * xhat
        if ctx.has_w and ctx.needs_input_grad[1]:
            per_seq_w = _seq_sums(_sequences(prod))
            gw = _param_grad(w, lambda fold: fold.add_many(per_seq_w))
        if ctx.has_b and ctx.needs_input_grad[2]:
            per_seq_b = _seq_sums(_sequences(g))
            gb = _param_grad(b, lambda fold: fold.add_many(per_seq_b))
        return gx, gw, gb, None


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer norm over the last dim in float64: mean = S/C, var = S((x - mean)^2)/C with exact
    sums S, rstd = 1/sqrt(var + eps); y = fp32(xhat * w + b). weight/bias may be None."""
    _f32("layer_norm x", x)
    C = x.shape[-1] if x.dim() else 0
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _f32(f"layer_norm {name}", t)
            if tuple(t.shape) != (C,):
                raise ExactError(f"layer_norm {name} shape {list(t.shape)} != [{C}]")
    if not (isinstance(eps, float | int) and eps > 0):
        raise ExactError(f"layer_norm eps must be a positive number, got {eps!r}")
    return _LayerNorm.apply(x, weight, bias, float(eps))


# --- GELU and elementwise transcendentals -----------------------------------------------------


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, form):
        ctx.form = form
        ctx.save_for_backward(x)
        xc = x.contiguous()
        if _use_kernels(xc):
            return kernels.gelu(xc, form)
        return tx.gelu32(xc, form)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xc, gc = x.contiguous(), g.contiguous()
        if _use_kernels(xc, gc):
            return kernels.gelu_grad(xc, gc, ctx.form), None
        return tx.gelu_grad32(xc, gc, ctx.form), None


def gelu(x, form="tanh"):
    """GELU, tanh form 0.5 x (1 + tanh(c (x + 0.044715 x^3))) or erf form 0.5 x (1 + erf(x/sqrt 2)),
    each computed in float64 (docs/exact-v1.md §3) and rounded once."""
    _f32("gelu x", x)
    if form not in ("tanh", "erf"):
        raise ExactError(f"gelu form must be 'tanh' or 'erf', got {form!r}")
    return _Gelu.apply(x, form)


class _Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        xc = x.contiguous()
        y = kernels.exp(xc) if _use_kernels(xc) else tx.exp32(xc)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return canon_nan(g * y)


class _Log(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return tx.log32(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return canon_nan(g / x)


class _Tanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return tx.tanh32(x)

    @staticmethod
    def backward(ctx, g):
        # 1 - tanh^2 = 4e / (1 + e)^2 with e = exp(-2|x|): no cancellation (1 - y^2 from the
        # rounded output would lose up to hundreds of ulps near |x| = 4) and no overflow
        (x,) = ctx.saved_tensors
        e = tx.exp_f64(-2.0 * torch.abs(x.to(F64)))
        d = (4.0 * e) / ((1.0 + e) * (1.0 + e))
        return canon_nan((g.to(F64) * d).to(F32))


class _Erf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return tx.erf32(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x64 = x.to(F64)
        d = tx.exp_f64(-(x64 * x64)) * (2.0 * tx.INV_SQRT_PI)
        return canon_nan((g.to(F64) * d).to(F32))


class _Trig(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos):
        ctx.save_for_backward(x)
        ctx.cos = cos
        return tx.cos32(x) if cos else tx.sin32(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x64 = x.to(F64)
        d = -tx.sin_f64(x64) if ctx.cos else tx.cos_f64(x64)
        return canon_nan((g.to(F64) * d).to(F32)), None


def exp(x):
    """e^x: exp_f64 (range reduction by ln 2, Taylor degree 13) rounded once; grad g * y."""
    return _Exp.apply(_f32("exp x", x))


def log(x):
    """log x (frexp reduction, atanh series); log 0 = -inf, log(x < 0) = NaN; grad g / x."""
    return _Log.apply(_f32("log x", x))


def tanh(x):
    """tanh x = sign(x) expm1(2|x|) / (expm1(2|x|) + 2); grad fp32(g 4e/(1+e)^2), e = exp(-2|x|)."""
    return _Tanh.apply(_f32("tanh x", x))


def erf(x):
    """erf x (Taylor below 2, continued fraction for erfc above); grad fp32(g 2/sqrt(pi) e^(-x^2))."""
    return _Erf.apply(_f32("erf x", x))


def sin(x):
    """sin x (Cody-Waite reduction by pi/2, Taylor); accurate for |x| <= 2^20."""
    return _Trig.apply(_f32("sin x", x), False)


def cos(x):
    """cos x (Cody-Waite reduction by pi/2, Taylor); accurate for |x| <= 2^20."""
    return _Trig.apply(_f32("cos x", x), True)


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xc = x.contiguous()
        return kernels.sigmoid(xc) if _use_kernels(xc) else tx.sigmoid32(xc)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xc, gc = x.contiguous(), g.contiguous()
        return kernels.sigmoid_grad(xc, gc) if _use_kernels(xc, gc) else tx.sigmoid_grad32(xc, gc)


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xc = x.contiguous()
        return kernels.silu(xc) if _use_kernels(xc) else tx.silu32(xc)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        xc, gc = x.contiguous(), g.contiguous()
        return kernels.silu_grad(xc, gc) if _use_kernels(xc, gc) else tx.silu_grad32(xc, gc)


def sigmoid(x):
    """1 / (1 + e^-x) from t = exp64(-|x|) (no overflow, no cancellation), rounded once; grad
    fp32(g s (1 - s)) in float64."""
    return _Sigmoid.apply(_f32("sigmoid x", x))


def silu(x):
    """SiLU x sigmoid(x) in float64, rounded once; grad fp32(g s (1 + x (1 - s))); the
    infinities take their limits (silu(-inf) = -0, silu'(+inf) = 1, silu'(-inf) = 0)."""
    return _Silu.apply(_f32("silu x", x))


class _Mul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return canon_nan(a * b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return canon_nan(g * b), canon_nan(g * a)


def mul(a, b):
    """a * b for same-shaped float32 tensors (one IEEE multiplication); grads g * b and g * a."""
    _f32("mul a", a)
    _f32("mul b", b)
    if a.shape != b.shape:
        raise ExactError(f"mul: shapes differ ({list(a.shape)} vs {list(b.shape)})")
    return _Mul.apply(a, b)


# --- RMSNorm ---------------------------------------------------------------------------------


def rms_norm_eager(x: torch.Tensor, w: torch.Tensor | None, eps: float):
    """(y, rstd): ms = S(x * x) / C, rstd = 1 / sqrt(ms + eps), y = RN32((x * rstd) * w)."""
    x64 = x.to(F64)
    n = _const(float(x.shape[-1]), x64)
    ms = exact_sum64(x64 * x64, -1, True) / n
    rstd = torch.div(_const(1.0, x64), xsqrt.sqrt64(ms + _const(eps, x64)))
    y = x64 * rstd
    if w is not None:
        y = y * w.to(F64)
    return canon_nan(y.to(F32)), rstd


def rms_norm_bwd_eager(x, g, w, rstd):
    """(dx, per-token products g * xhat): gh = g * w, m = S(gh * xhat) / C,
    dx = RN32(rstd * (gh - xhat * m))."""
    x64, g64 = x.to(F64), g.to(F64)
    xhat = x64 * rstd
    n = _const(float(x.shape[-1]), x64)
    gh = g64 * w.to(F64) if w is not None else g64
    m = exact_sum64(gh * xhat, -1, True) / n
    return canon_nan((rstd * (gh - xhat * m)).to(F32)), g64 * xhat


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        ctx.w = w
        y, rstd = rms_norm_eager(x, w, eps)
        ctx.save_for_backward(x, rstd)
        return y

    @staticmethod
    def backward(ctx, g):
        x, rstd = ctx.saved_tensors
        w = ctx.w
        gx, prod = rms_norm_bwd_eager(x, g.contiguous(), w, rstd)
        gw = None
        if w is not None and ctx.needs_input_grad[1]:
            per_seq_w = _seq_sums(_sequences(prod))
            gw = _param_grad(w, lambda fold: fold.add_many(per_seq_w))
        return gx, gw, None


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last dim in float64: ms = S(x^2)/C (squares exact), rstd =
    1/sqrt(ms + eps), y = fp32(x rstd w); weight may be None. Backward as docs/exact-v1.md §2."""
    _f32("rms_norm x", x)
    C = x.shape[-1] if x.dim() else 0
    if weight is not None:
        _f32("rms_norm weight", weight)
        if tuple(weight.shape) != (C,):
            raise ExactError(f"rms_norm weight shape {list(weight.shape)} != [{C}]")
    if not (isinstance(eps, float | int) and eps > 0):
        raise ExactError(f"rms_norm eps must be a positive number, got {eps!r}")
    return _RMSNorm.apply(x, weight, float(eps))


# --- rotary position embeddings and grouped-query heads ---------------------------------------


def rope_eager(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves (x1, x2) of the last dim: y1 = x1 c - x2 s, y2 = x2 c + x1 s in float64
    (products exact), each rounded to float32."""
    h = x.shape[-1] // 2
    x64, c, s = x.to(F64), cos.to(F64), sin.to(F64)
    x1, x2 = x64[..., :h], x64[..., h:]
    return canon_nan(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(F32))


def rope_bwd_eager(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The transposed rotation: dx1 = g1 c + g2 s, dx2 = g2 c - g1 s."""
    h = g.shape[-1] // 2
    g64, c, s = g.to(F64), cos.to(F64), sin.to(F64)
    g1, g2 = g64[..., :h], g64[..., h:]
    return canon_nan(torch.cat([g1 * c + g2 * s, g2 * c - g1 * s], dim=-1).to(F32))


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_eager(x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return rope_bwd_eager(g, cos, sin), None, None


def rope(x, cos, sin):
    """Rotary embedding of x [..., T, D] (halves convention) with float32 tables cos, sin
    [T, D/2] (oracle.exact.transcendental.rope_tables); the tables are constants (no gradient)."""
    _f32("rope x", x)
    _f32("rope cos", cos)
    _f32("rope sin", sin)
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ExactError(f"rope: x must be [..., T, D] with D even, got {list(x.shape)}")
    want = (x.shape[-2], x.shape[-1] // 2)
    if tuple(cos.shape) != want or tuple(sin.shape) != want:
        raise ExactError(f"rope: tables must be {list(want)}, got {list(cos.shape)} and {list(sin.shape)}")
    return _Rope.apply(x, cos, sin)


def rope_tables(n_pos: int, head_dim: int, theta: float, device=None):
    """(cos, sin) float32 [n_pos, D/2] by the exact algorithm of transcendental.rope_tables."""
    if not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ExactError(f"rope_tables: head_dim must be an even int >= 2, got {head_dim!r}")
    if not isinstance(n_pos, int) or not 0 < n_pos <= tx.ROPE_MAX_POSITIONS:
        raise ExactError(f"rope_tables: n_pos must be in [1, {tx.ROPE_MAX_POSITIONS}], got {n_pos!r}")
    if not (isinstance(theta, float | int) and theta > 1):
        raise ExactError(f"rope_tables: theta must be a number > 1, got {theta!r}")
    return tx.rope_tables(n_pos, head_dim, float(theta), device)


class _RepeatHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n_rep):
        B, Hk, T, D = x.shape
        ctx.n_rep = n_rep
        return x.unsqueeze(2).expand(B, Hk, n_rep, T, D).reshape(B, Hk * n_rep, T, D)

    @staticmethod
    def backward(ctx, g):
        B, H, T, D = g.shape
        n = ctx.n_rep
        s = exact_sum64(g.reshape(B, H // n, n, T, D), 2)
        return canon_nan(s.to(F32)), None


def repeat_heads(x, n_rep: int):
    """Grouped-query heads: x [B, Hkv, T, D] -> [B, Hkv * n_rep, T, D], head h reading kv head
    h // n_rep; the backward sums each group's n_rep gradients exactly, rounded once."""
    _f32("repeat_heads x", x)
    if x.dim() != 4:
        raise ExactError(f"repeat_heads: x must be [B, H, T, D], got {list(x.shape)}")
    if not isinstance(n_rep, int) or isinstance(n_rep, bool) or n_rep < 1:
        raise ExactError(f"repeat_heads: n_rep must be a positive int, got {n_rep!r}")
    if n_rep == 1:
        return x
    return _RepeatHeads.apply(x, n_rep)


# --- embedding -------------------------------------------------------------------------------


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx, w):
        ctx.save_for_backward(idx)
        ctx.w = w
        return w.index_select(0, idx.reshape(-1)).reshape(*idx.shape, w.shape[1])

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        w = ctx.w
        C = w.shape[1]
        if idx.dim() >= 2:
            ids = idx.reshape(idx.shape[0], -1)
        else:
            ids = idx.reshape(1, -1)
        g3 = g.reshape(ids.shape[0], ids.shape[1], C)
        T = ids.shape[1]
        s = sum_bits(T)
        g64 = g3.to(F64)
        fin = bool(torch.isfinite(g64).all())
        clean = g64 if fin else torch.where(torch.isfinite(g64), g64, torch.zeros_like(g64))
        q, e = quantise(clean, 1, s)
        scale = pow2(e - s)

        def fill(fold):
            for b in range(ids.shape[0]):
                rows, inv = torch.unique(ids[b], sorted=True, return_inverse=True)
                part = torch.zeros(rows.shape[0], C, dtype=F64, device=g.device).index_add_(0, inv, q[b])
                part = part * scale[b]
                if not fin:
                    # IEEE classes of each row's sum of the raw (non-finite) gradients
                    raw = torch.zeros(rows.shape[0], C, dtype=F64, device=g.device)
                    nonfin = torch.where(torch.isfinite(g64[b]), torch.zeros_like(g64[b]), g64[b])
                    raw.index_add_(0, inv, torch.where(torch.isnan(nonfin), torch.zeros_like(nonfin), nonfin))
                    has_nan = torch.zeros(rows.shape[0], C, dtype=F64, device=g.device).index_add_(
                        0, inv, torch.isnan(g64[b]).to(F64)) > 0
                    part = torch.where(torch.isfinite(raw), part, raw)
                    part = torch.where(has_nan, torch.full_like(part, math.nan), part)
                fold.add(part, rows)
        return None, _param_grad(w, fill)


def embedding(idx, weight):
    """weight[idx] for int64 idx; the backward is an exact scatter-add per sequence (dim 0 of a
    >= 2-d idx): gradient rows quantised along the token axis to sum_bits(T), summed as integers."""
    _f32("embedding weight", weight)
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64:
        raise ExactError(
            f"embedding idx must be an int64 tensor, got {getattr(idx, 'dtype', type(idx).__name__)}"
        )
    if weight.dim() != 2:
        raise ExactError(f"embedding weight must be [num, dim], got {list(weight.shape)}")
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= weight.shape[0]:
            raise ExactError(f"embedding index {lo if lo < 0 else hi} outside [0, {weight.shape[0]})")
    return _Embedding.apply(idx, weight)


# --- dropout, residual add, attention ---------------------------------------------------------


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep, kp):
        ctx.save_for_backward(keep, kp)
        return canon_nan(torch.where(keep, x / kp, torch.zeros((), dtype=F32, device=x.device)))

    @staticmethod
    def backward(ctx, g):
        keep, kp = ctx.saved_tensors
        return canon_nan(torch.where(keep, g / kp, torch.zeros((), dtype=F32, device=g.device))), None, None


def dropout(x, p: float, keep_mask):
    """where(keep, x / (1 - p), 0): 1 - p computed in Python float64, rounded to float32, and x
    divided by it as a float32 tensor (one correctly rounded division)."""
    _f32("dropout x", x)
    if not isinstance(p, float | int) or not 0.0 <= p < 1.0:
        raise ExactError(f"dropout p must be in [0, 1), got {p!r}")
    if p == 0.0:
        return x
    if not isinstance(keep_mask, torch.Tensor) or keep_mask.dtype != torch.bool:
        raise ExactError("dropout keep_mask must be a bool tensor")
    if keep_mask.shape != x.shape:
        raise ExactError(f"dropout keep_mask shape {list(keep_mask.shape)} != x shape {list(x.shape)}")
    kp = _const(1.0 - float(p), x, F32)
    return _Dropout.apply(x, keep_mask, kp)


class _Add(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return canon_nan(a + b)

    @staticmethod
    def backward(ctx, g):
        return g, g


def add(a, b):
    """a + b for same-shaped float32 tensors (one IEEE addition, canonical NaN)."""
    _f32("add a", a)
    _f32("add b", b)
    if a.shape != b.shape:
        raise ExactError(f"add: shapes differ ({list(a.shape)} vs {list(b.shape)}); broadcasting over "
                         f"sequences would mix their gradients, so expand explicitly (e.g. embed "
                         f"positions with an index tensor of shape [B, T])")
    return _Add.apply(a, b)


class _DivConst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, d):
        ctx.save_for_backward(d)
        return canon_nan(x / d)

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return canon_nan(g / d), None


def causal_attention(q, k, v, *, variant="single", dropout_p=0.0, dropout_mask=None, bf16=False):
    """Math-form causal attention over [B, H, T, D]: softmax(mask(q k^T / sqrt(D))) v, each step an
    exact op; sqrt(D) is the correctly rounded float32 sqrt of D, applied as a float32 division. Dropout on
    the attention weights uses the caller's keep mask [B, H, T, T]. k and v may have fewer heads than q
    (grouped-query attention, Hkv dividing H): they are widened by repeat_heads. `bf16`: both
    products take and give bfloat16 values (matmul's rule); the scaling and the softmax stay float32."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _f32(f"causal_attention {name}", t)
    if (q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0]
            or k.shape[2:] != q.shape[2:] or k.shape[1] < 1 or q.shape[1] % k.shape[1]):
        raise ExactError(f"causal_attention: q must be [B, H, T, D] and k, v [B, Hkv, T, D] with Hkv "
                         f"dividing H, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves H / Hkv heads
        n_rep = q.shape[1] // k.shape[1]
        k, v = repeat_heads(k, n_rep), repeat_heads(v, n_rep)
    T, D = q.shape[-2], q.shape[-1]
    att = matmul(q, k.transpose(-2, -1), variant=variant, bf16=bf16)
    att = _DivConst.apply(att, xsqrt.sqrt32(_const(float(D), q, F32)))
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = torch.where(causal, att, _const(-math.inf, q, F32))
    att = softmax(att, dim=-1)
    if dropout_p > 0.0:
        if dropout_mask is None:
            raise ExactError("causal_attention: dropout_p > 0 needs dropout_mask")
        att = dropout(att, dropout_p, dropout_mask)
    return matmul(att, v.contiguous(), variant=variant, bf16=bf16)


# --- global sum of squares -------------------------------------------------------------------

SOS_CHUNK = 1 << 16


def sum_of_squares(tensors) -> torch.Tensor:
    """Exact sum of x^2 over all tensors (canonical order), rounded once to a float32 scalar.

    Squares are exact in float64; each tensor is cut into chunks of 2^16 elements, each chunk
    quantised to sum_bits(2^16) = 37 bits and summed exactly; the chunk sums are added as exact
    integers and rounded once. NaN anywhere gives NaN; otherwise inf anywhere gives inf."""
    tensors = list(tensors)
    if not tensors:
        raise ExactError("sum_of_squares needs at least one tensor")
    device = tensors[0].device
    terms: list[tuple[int, int]] = []
    has_nan = has_inf = False
    for i, t in enumerate(tensors):
        _f32(f"sum_of_squares tensor {i}", t)
        flat = t.reshape(-1)
        if flat.numel() == 0:
            continue
        if _use_kernels(flat):  # the same terms, in one compiled pass per chunk
            bad, got = kernels.sum_of_squares_chunks(flat, SOS_CHUNK, sum_bits(SOS_CHUNK))
            if bad is not None:
                has_nan = has_nan or bad == "nan"
                has_inf = True
            terms += got
            continue
        sq = flat.to(F64) * flat.to(F64)
        if not bool(torch.isfinite(sq).all()):
            has_nan = has_nan or bool(torch.isnan(sq).any())
            has_inf = True
            continue
        pad = (-sq.numel()) % SOS_CHUNK
        if pad:
            sq = torch.cat([sq, torch.zeros(pad, dtype=F64, device=sq.device)])
        rows = sq.reshape(-1, SOS_CHUNK)
        s = sum_bits(SOS_CHUNK)
        q, e = quantise(rows, 1, s)
        n = torch.sum(q, dim=1)
        for ni, ei in zip(n.tolist(), (e.squeeze(1) - s).tolist(), strict=True):
            if ni:
                terms.append((int(ni), int(ei)))
    if has_nan:
        return torch.full((), math.nan, dtype=F32, device=device)
    if has_inf:
        return torch.full((), math.inf, dtype=F32, device=device)
    if not terms:
        return torch.zeros((), dtype=F32, device=device)
    emin = builtins.min(e for _, e in terms)
    total = builtins.sum(n << (e - emin) for n, e in terms)
    return torch.full((), round_scaled_int_to_f32(total, emin), dtype=F32, device=device)


__all__ = [
    "linear",
    "matmul",
    "sum",
    "mean",
    "softmax",
    "log_softmax",
    "layer_norm",
    "gelu",
    "exp",
    "log",
    "tanh",
    "erf",
    "sin",
    "cos",
    "sigmoid",
    "silu",
    "mul",
    "rms_norm",
    "rope",
    "rope_tables",
    "repeat_heads",
    "embedding",
    "cross_entropy",
    "dropout",
    "causal_attention",
    "add",
    "sum_of_squares",
    "NAME",
    "VARIANTS",
]
