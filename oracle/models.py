"""The models: a GPT in nanoGPT's shape, a Llama-family decoder and a token-level MLP language
model.

Parameters are plain tensors in one canonical order (the state's order); initialisation draws from
Philox keyed by the parameter's name, and the forward pass is written over an op namespace
(oracle.exact.ops or oracle.native), so exact-v1 and torch-native run the same model code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from commitments.spec import ModelSpec
from oracle import rng

LN_EPS = 1e-5
INIT_STEP = 0  # the RNG step of initialisation; training steps are 1..T


class ModelError(ValueError):
    """Model input that cannot be used (bad token ids, sequence too long), with the reason."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # "normal", "zeros" or "ones"
    std: float = 0.0
    # "matrix", "embedding", "bias" or "norm": what the optimizer's weight-decay mask reads
    # (oracle.optim.DECAYING_ROLES); None leaves it to the tensor's number of dimensions.
    role: str | None = None


@dataclass(frozen=True)
class Dropout:
    """Dropout keying for one forward pass: masks are Philox(seed, step, site, element index).

    `row_offset` is the first sequence of this micro-batch within the step's batch, so a split
    batch draws exactly the masks of the unsplit one."""

    seed: int
    step: int
    p: float
    row_offset: int = 0

    def mask(self, site: str, shape: tuple[int, ...], device) -> torch.Tensor:
        per_row = math.prod(shape[1:])
        return rng.keep_mask(self.seed, self.step, "dropout/" + site, shape, self.p,
                             offset=self.row_offset * per_row, device=device)

    def apply(self, ops, x: torch.Tensor, site: str) -> torch.Tensor:
        return ops.dropout(x, self.p, self.mask(site, tuple(x.shape), x.device))


def zeros(shape: tuple[int, ...], device=None) -> torch.Tensor:
    """float32 zeros. On CPU from calloc'd memory: the kernel maps zero pages lazily, so the
    zero moments of a large state cost no page faults until a step writes them (torch.zeros
    writes every page: half a second per 500 MB on a busy machine)."""
    if device is None or str(device).split(":")[0] == "cpu":  # None, a torch.device or its name
        return torch.from_numpy(np.zeros(shape, dtype=np.float32))
    return torch.zeros(shape, dtype=torch.float32, device=device)


def init_params(specs: list[ParamSpec], seed: int, device=None) -> dict[str, torch.Tensor]:
    """Tensors for `specs`, in order; normals are keyed by site "init/<name>" at step 0."""
    out: dict[str, torch.Tensor] = {}
    for p in specs:
        if p.init == "normal":
            out[p.name] = rng.normal(seed, INIT_STEP, "init/" + p.name, p.shape, std=p.std, device=device)
        elif p.init == "zeros":
            out[p.name] = zeros(p.shape, device)
        elif p.init == "ones":
            out[p.name] = torch.ones(p.shape, dtype=torch.float32, device=device)
        else:
            raise ModelError(f"{p.name}: unknown init {p.init!r}")
    return out


class GPT:
    """nanoGPT: token + position embeddings, pre-LN blocks (causal self-attention, GELU MLP),
    a final layer norm and a head tied to the token embedding or not."""

    def __init__(self, cfg: ModelSpec, *, matmul: str = "single") -> None:
        self.cfg = cfg
        self.matmul = matmul

    def param_specs(self) -> list[ParamSpec]:
        c = self.cfg
        C, std = c.n_embd, c.init_std
        proj_std = std / math.sqrt(2 * c.n_layer)  # GPT-2: residual projections shrink with depth
        specs = [ParamSpec("wte", (c.vocab_size, C), "normal", std, role="embedding"),
                 ParamSpec("wpe", (c.block_size, C), "normal", std, role="embedding")]

        def ln(name):
            specs.append(ParamSpec(f"{name}.weight", (C,), "ones", role="norm"))
            if c.bias:
                specs.append(ParamSpec(f"{name}.bias", (C,), "zeros", role="bias"))

        def lin(name, n_out, n_in, w_std):
            specs.append(ParamSpec(f"{name}.weight", (n_out, n_in), "normal", w_std, role="matrix"))
            if c.bias:
                specs.append(ParamSpec(f"{name}.bias", (n_out,), "zeros", role="bias"))

        for i in range(c.n_layer):
            ln(f"h.{i}.ln_1")
            lin(f"h.{i}.attn.c_attn", 3 * C, C, std)
            lin(f"h.{i}.attn.c_proj", C, C, proj_std)
            ln(f"h.{i}.ln_2")
            lin(f"h.{i}.mlp.c_fc", 4 * C, C, std)
            lin(f"h.{i}.mlp.c_proj", C, 4 * C, proj_std)
        ln("ln_f")
        if not c.tie_weights:
            specs.append(ParamSpec("lm_head.weight", (c.vocab_size, C), "normal", std, role="matrix"))
        return specs

    def forward(self, ops, P: dict[str, torch.Tensor], idx: torch.Tensor,
                drop: Dropout | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] for token ids [B, T]."""
        c = self.cfg
        B, T = idx.shape
        if T > c.block_size:
            raise ModelError(f"sequence length {T} exceeds block_size {c.block_size}")
        C, H = c.n_embd, c.n_head
        mm = self.matmul
        if drop is not None and drop.p == 0.0:
            drop = None
        # Positions are embedded per row, so the position table's gradient is one exact scatter-add.
        pos = torch.arange(T, device=idx.device).expand(B, T)
        x = ops.add(ops.embedding(idx, P["wte"]), ops.embedding(pos, P["wpe"]))
        if drop:
            x = drop.apply(ops, x, "emb")
        for i in range(c.n_layer):
            p = f"h.{i}."
            h = ops.layer_norm(x, P[p + "ln_1.weight"], P.get(p + "ln_1.bias"), LN_EPS)
            qkv = ops.linear(h, P[p + "attn.c_attn.weight"], P.get(p + "attn.c_attn.bias"), variant=mm)
            q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, dim=2))
            if drop:
                att_mask = drop.mask(p + "attn", (B, H, T, T), idx.device)
                y = ops.causal_attention(q, k, v, variant=mm, dropout_p=drop.p, dropout_mask=att_mask)
            else:
                y = ops.causal_attention(q, k, v, variant=mm, dropout_p=0.0, dropout_mask=None)
            y = y.transpose(1, 2).reshape(B, T, C)
            y = ops.linear(y, P[p + "attn.c_proj.weight"], P.get(p + "attn.c_proj.bias"), variant=mm)
            if drop:
                y = drop.apply(ops, y, p + "attn_resid")
            x = ops.add(x, y)
            h = ops.layer_norm(x, P[p + "ln_2.weight"], P.get(p + "ln_2.bias"), LN_EPS)
            h = ops.linear(h, P[p + "mlp.c_fc.weight"], P.get(p + "mlp.c_fc.bias"), variant=mm)
            h = ops.gelu(h, c.gelu)
            h = ops.linear(h, P[p + "mlp.c_proj.weight"], P.get(p + "mlp.c_proj.bias"), variant=mm)
            if drop:
                h = drop.apply(ops, h, p + "mlp_resid")
            x = ops.add(x, h)
        x = ops.layer_norm(x, P["ln_f.weight"], P.get("ln_f.bias"), LN_EPS)
        head = P["wte"] if c.tie_weights else P["lm_head.weight"]
        return ops.linear(x, head, None, variant=mm)


class MLPLM:
    """Token-level MLP language model: embedding -> (linear, GELU)* -> vocab logits.

    Each position predicts the next token from its own token only; the head is never tied."""

    def __init__(self, cfg: ModelSpec, *, matmul: str = "single") -> None:
        self.cfg = cfg
        self.matmul = matmul

    def param_specs(self) -> list[ParamSpec]:
        c = self.cfg
        specs = [ParamSpec("wte", (c.vocab_size, c.n_embd), "normal", c.init_std, role="embedding")]
        widths = [c.n_embd, *c.hidden]
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            specs.append(ParamSpec(f"fc.{i}.weight", (n_out, n_in), "normal", c.init_std, role="matrix"))
            if c.bias:
                specs.append(ParamSpec(f"fc.{i}.bias", (n_out,), "zeros", role="bias"))
        specs.append(
            ParamSpec("head.weight", (c.vocab_size, widths[-1]), "normal", c.init_std, role="matrix")
        )
        if c.bias:
            specs.append(ParamSpec("head.bias", (c.vocab_size,), "zeros", role="bias"))
        return specs

    def forward(self, ops, P: dict[str, torch.Tensor], idx: torch.Tensor,
                drop: Dropout | None = None) -> torch.Tensor:
        c = self.cfg
        if drop is not None and drop.p == 0.0:
            drop = None
        x = ops.embedding(idx, P["wte"])
        for i in range(len(c.hidden)):
            x = ops.linear(x, P[f"fc.{i}.weight"], P.get(f"fc.{i}.bias"), variant=self.matmul)
            x = ops.gelu(x, c.gelu)
            if drop:
                x = drop.apply(ops, x, f"fc.{i}")
        return ops.linear(x, P["head.weight"], P.get("head.bias"), variant=self.matmul)


class Llama:
    """A Llama-family decoder. Pre-norm blocks: x + o(attn(rope(q), rope(k), v)) and x + down(silu(gate) * up)
    (SwiGLU), with RMSNorm, rotary position embeddings, grouped-query attention (n_kv_head kv heads), no
    biases and a tied or untied head. Parameter names are transformers' `LlamaForCausalLM` names
    without its "model." prefix, so a Hugging Face checkpoint maps onto them one to one; under
    exact-v1 the rotary tables come from the exact algorithm of docs/exact-v1.md §3."""

    def __init__(self, cfg: ModelSpec, *, matmul: str = "single") -> None:
        if cfg.kind != "llama":
            raise ModelError(f"Llama needs a model of kind 'llama', got {cfg.kind!r}")
        self.cfg = cfg
        self.matmul = matmul

    @property
    def head_dim(self) -> int:
        return self.cfg.n_embd // self.cfg.n_head

    def param_specs(self) -> list[ParamSpec]:
        c = self.cfg
        C, std, kv = c.n_embd, c.init_std, c.n_kv_head * self.head_dim
        specs = [ParamSpec("embed_tokens.weight", (c.vocab_size, C), "normal", std, role="embedding")]
        for i in range(c.n_layer):
            p = f"layers.{i}."
            specs += [
                ParamSpec(p + "input_layernorm.weight", (C,), "ones", role="norm"),
                ParamSpec(p + "self_attn.q_proj.weight", (C, C), "normal", std, role="matrix"),
                ParamSpec(p + "self_attn.k_proj.weight", (kv, C), "normal", std, role="matrix"),
                ParamSpec(p + "self_attn.v_proj.weight", (kv, C), "normal", std, role="matrix"),
                ParamSpec(p + "self_attn.o_proj.weight", (C, C), "normal", std, role="matrix"),
                ParamSpec(p + "post_attention_layernorm.weight", (C,), "ones", role="norm"),
                ParamSpec(p + "mlp.gate_proj.weight", (c.intermediate_size, C), "normal", std, role="matrix"),
                ParamSpec(p + "mlp.up_proj.weight", (c.intermediate_size, C), "normal", std, role="matrix"),
                ParamSpec(p + "mlp.down_proj.weight", (C, c.intermediate_size), "normal", std, role="matrix"),
            ]
        specs.append(ParamSpec("norm.weight", (C,), "ones", role="norm"))
        if not c.tie_weights:
            specs.append(ParamSpec("lm_head.weight", (c.vocab_size, C), "normal", std, role="matrix"))
        return specs

    def forward(self, ops, P: dict[str, torch.Tensor], idx: torch.Tensor,
                drop: Dropout | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] for token ids [B, T]."""
        c = self.cfg
        B, T = idx.shape
        if T > c.block_size:
            raise ModelError(f"sequence length {T} exceeds block_size {c.block_size}")
        C, H, Hkv, D = c.n_embd, c.n_head, c.n_kv_head, self.head_dim
        mm, eps = self.matmul, c.rms_eps
        if drop is not None and drop.p == 0.0:
            drop = None
        cos, sin = ops.rope_tables(T, D, c.rope_theta, device=idx.device)
        x = ops.embedding(idx, P["embed_tokens.weight"])
        for i in range(c.n_layer):
            p = f"layers.{i}."
            h = ops.rms_norm(x, P[p + "input_layernorm.weight"], eps)
            q = ops.linear(h, P[p + "self_attn.q_proj.weight"], None, variant=mm)
            k = ops.linear(h, P[p + "self_attn.k_proj.weight"], None, variant=mm)
            v = ops.linear(h, P[p + "self_attn.v_proj.weight"], None, variant=mm)
            q = ops.rope(q.reshape(B, T, H, D).transpose(1, 2), cos, sin)
            k = ops.rope(k.reshape(B, T, Hkv, D).transpose(1, 2), cos, sin)
            v = v.reshape(B, T, Hkv, D).transpose(1, 2)
            if drop:
                att_mask = drop.mask(p + "attn", (B, H, T, T), idx.device)
                y = ops.causal_attention(q, k, v, variant=mm, dropout_p=drop.p, dropout_mask=att_mask)
            else:
                y = ops.causal_attention(q, k, v, variant=mm, dropout_p=0.0, dropout_mask=None)
            y = ops.linear(
                y.transpose(1, 2).reshape(B, T, C), P[p + "self_attn.o_proj.weight"], None, variant=mm
            )
            if drop:
                y = drop.apply(ops, y, p + "attn_resid")
            x = ops.add(x, y)
            h = ops.rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
            gate = ops.linear(h, P[p + "mlp.gate_proj.weight"], None, variant=mm)
            up = ops.linear(h, P[p + "mlp.up_proj.weight"], None, variant=mm)
            h = ops.linear(ops.mul(ops.silu(gate), up), P[p + "mlp.down_proj.weight"], None, variant=mm)
            if drop:
                h = drop.apply(ops, h, p + "mlp_resid")
            x = ops.add(x, h)
        x = ops.rms_norm(x, P["norm.weight"], eps)
        head = P["embed_tokens.weight"] if c.tie_weights else P["lm_head.weight"]
        return ops.linear(x, head, None, variant=mm)


def build(cfg: ModelSpec, *, matmul: str = "single"):
    """The model a spec names: GPT, Llama or MLPLM."""
    if cfg.kind == "gpt":
        return GPT(cfg, matmul=matmul)
    if cfg.kind == "mlp":
        return MLPLM(cfg, matmul=matmul)
    if cfg.kind == "llama":
        return Llama(cfg, matmul=matmul)
    raise ModelError(f"unknown model kind {cfg.kind!r}")


def dropout_sites(cfg: ModelSpec) -> list[str]:
    """Every dropout site name of a model (each distinct, hence distinct Philox streams)."""
    if cfg.kind == "mlp":
        return [f"dropout/fc.{i}" for i in range(len(cfg.hidden))]
    if cfg.kind == "llama":
        return [
            f"dropout/layers.{i}.{s}" for i in range(cfg.n_layer) for s in ("attn", "attn_resid", "mlp_resid")
        ]
    sites = ["dropout/emb"]
    for i in range(cfg.n_layer):
        sites += [f"dropout/h.{i}.{s}" for s in ("attn", "attn_resid", "mlp_resid")]
    return sites
