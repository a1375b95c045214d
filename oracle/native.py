"""The torch-native op namespace: the same signatures as oracle.exact.ops, in stock PyTorch.

Bit-exact only on one hardware class (device, dispatch level, threads, library versions), which
the spec declares. Randomness still comes from oracle.rng, so only the arithmetic differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "torch-native"


class _RoundBF16(torch.autograd.Function):
    """Stock RN-even conversion to bfloat16 and back; the gradient passes unchanged (float32)."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g


def round_bf16(x):
    return None if x is None else _RoundBF16.apply(x)


def linear(x, w, b=None, *, variant="single", bf16=False):
    if bf16:  # dtype bf16-mixed: the same rounding points as exact-v1's linear
        return round_bf16(F.linear(round_bf16(x), round_bf16(w), round_bf16(b)))
    return F.linear(x, w, b)


def matmul(a, b, *, variant="single", bf16=False):
    if bf16:
        return round_bf16(torch.matmul(round_bf16(a), round_bf16(b)))
    return torch.matmul(a, b)


def sum(x, dim=None, keepdim=False):  # noqa: A001 - mirrors the exact namespace
    return torch.sum(x) if dim is None else torch.sum(x, dim=dim, keepdim=keepdim)


def mean(x, dim=None, keepdim=False):
    return torch.mean(x) if dim is None else torch.mean(x, dim=dim, keepdim=keepdim)


def softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def log_softmax(x, dim=-1):
    return torch.log_softmax(x, dim=dim)


def layer_norm(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def gelu(x, form="tanh"):
    return F.gelu(x, approximate="tanh" if form == "tanh" else "none")


exp, log, tanh, erf = torch.exp, torch.log, torch.tanh, torch.erf


def sigmoid(x):
    return torch.sigmoid(x)


def silu(x):
    return F.silu(x)


def mul(a, b):
    return a * b


def rms_norm(x, w, eps=1e-6):
    """Llama's RMSNorm: x * rsqrt(mean(x^2) + eps), times the weight."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else w * y


def rope(x, cos, sin):
    """Rotary embedding, halves convention: x * cos + rotate_half(x) * sin."""
    h = x.shape[-1] // 2
    c, s = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * c + rot * s


def rope_tables(n_pos, head_dim, theta, device=None):
    """(cos, sin) [n_pos, D/2] as transformers computes them: float32 inverse frequencies
    1 / theta^(2i/D), float32 angles p * inv_freq, torch.cos and torch.sin."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    ang = torch.arange(n_pos, device=device).float().reshape(-1, 1) * inv.reshape(1, -1)
    return torch.cos(ang), torch.sin(ang)


def repeat_heads(x, n_rep):
    if n_rep == 1:
        return x
    B, H, T, D = x.shape
    return x.unsqueeze(2).expand(B, H, n_rep, T, D).reshape(B, H * n_rep, T, D)


def embedding(idx, w):
    return F.embedding(idx, w)


def add(a, b):
    return a + b


def dropout(x, p, keep_mask):
    if p == 0.0:
        return x
    scale = torch.tensor(1.0 / (1.0 - p), dtype=x.dtype, device=x.device)
    return torch.where(keep_mask, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))


def cross_entropy(logits, targets, *, total_count=None):
    """Mean token cross-entropy; with `total_count`, the sum divided by that count instead, so
    micro-batch losses add up to the whole batch's mean."""
    flat = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    if total_count is None:
        return F.cross_entropy(flat, t)
    return F.cross_entropy(flat, t, reduction="sum") / torch.tensor(
        float(total_count), dtype=flat.dtype, device=flat.device
    )


def causal_attention(q, k, v, *, variant="single", dropout_p=0.0, dropout_mask=None, bf16=False):
    """Math-form causal attention over [B, H, T, D] (no fused SDPA kernels)."""
    if k.shape[1] != q.shape[1]:
        k, v = repeat_heads(k, q.shape[1] // k.shape[1]), repeat_heads(v, q.shape[1] // k.shape[1])
    T, D = q.shape[-2], q.shape[-1]
    scale = torch.tensor(D**-0.5, dtype=q.dtype, device=q.device)
    att = matmul(q, k.transpose(-2, -1), bf16=bf16) * scale
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~causal, float("-inf"))
    att = torch.softmax(att, dim=-1)
    if dropout_p > 0.0:
        att = dropout(att, dropout_p, dropout_mask)
    return matmul(att, v, bf16=bf16)


def sum_of_squares(tensors):
    return torch.stack([torch.sum(t * t) for t in tensors]).sum()
