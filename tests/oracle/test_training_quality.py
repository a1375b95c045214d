"""Training quality: exact-v1 trains a small GPT as well as stock PyTorch fp32 does.

The same GPT (same Philox initial weights, same batches from the seeded schedule, same AdamW
hyperparameters and clipping) is trained with oracle.step under exact-v1 and with torch.nn +
torch.optim.AdamW; both final models are evaluated by the same torch.nn code on held-out data.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from commitments.dataset import Dataset, prepare_default_corpus, train_validation_split
from commitments.schedule import derive_schedule
from commitments.spec import Spec
from oracle.step import init_state, step

pytestmark = pytest.mark.usefixtures("single_thread")

STEPS = 300
SPEC = Spec.from_dict(
    {
        "profile": "exact-v1",
        "steps": STEPS,
        "model": {
            "kind": "gpt",
            "vocab_size": 256,
            "block_size": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_embd": 64,
            "dropout": 0.0,
            "bias": True,
            "tie_weights": True,
            "gelu": "tanh",
        },
        "optimizer": {
            "kind": "adamw",
            "lr": 3e-3,
            "beta1": 0.9,
            "beta2": 0.95,
            "weight_decay": 0.1,
            "grad_clip": 1.0,
        },
        "batch": {"batch_size": 8, "seq_len": 32},
        "rng": {"seed": 42, "schedule_seed": 7},
    }
)


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class RefGPT(nn.Module):
    """nanoGPT in stock torch.nn, loadable from the oracle's parameter names."""

    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg.n_embd, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head

    def load_oracle(self, P):
        with torch.no_grad():
            self.wte.weight.copy_(P["wte"])
            self.wpe.weight.copy_(P["wpe"])
            for i, b in enumerate(self.h):
                for ours, mod in [
                    ("ln_1", b.ln_1),
                    ("ln_2", b.ln_2),
                    ("attn.c_attn", b.c_attn),
                    ("attn.c_proj", b.attn_proj),
                    ("mlp.c_fc", b.c_fc),
                    ("mlp.c_proj", b.mlp_proj),
                ]:
                    mod.weight.copy_(P[f"h.{i}.{ours}.weight"])
                    mod.bias.copy_(P[f"h.{i}.{ours}.bias"])
            self.ln_f.weight.copy_(P["ln_f.weight"])
            self.ln_f.bias.copy_(P["ln_f.bias"])
        return self


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.npy"
    prepare_default_corpus(path, max_bytes=1 << 20)
    return Dataset.open(path, SPEC.sample_len, vocab_size=256)


def _val_loss(model, ds, val):
    idx = [val[i] for i in range(0, len(val), max(1, len(val) // 256))][:256]
    b = torch.from_numpy(ds.batch(idx))
    with torch.no_grad():
        logits = model(b[:, :-1])
        return float(F.cross_entropy(logits.reshape(-1, 256), b[:, 1:].reshape(-1)))


@pytest.mark.slow
def test_exact_training_matches_stock_pytorch(corpus):
    train, val = train_validation_split(corpus.num_samples)
    schedule = derive_schedule(SPEC.rng.schedule_seed, len(train), STEPS, SPEC.batch.batch_size)
    init = init_state(SPEC)

    torch.manual_seed(0)  # stock model only; its weights are overwritten with the Philox init
    ref = RefGPT(SPEC.model).load_oracle(init.params())
    decay = [p for n, p in ref.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in ref.named_parameters() if p.dim() < 2]
    o = SPEC.optimizer
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    state = init
    for t in range(1, STEPS + 1):
        batch = corpus.batch(schedule.batch(t))
        state, _ = step(state, batch, SPEC, t)
        b = torch.from_numpy(batch)
        loss = F.cross_entropy(ref(b[:, :-1]).reshape(-1, 256), b[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), o.grad_clip)
        opt.step()

    v_ref = _val_loss(ref, corpus, val)
    v_exact = _val_loss(RefGPT(SPEC.model).load_oracle(state.params()), corpus, val)
    v_init = _val_loss(RefGPT(SPEC.model).load_oracle(init.params()), corpus, val)
    assert v_init > 0.95 * math.log(256)
    assert v_ref < 0.7 * v_init, f"the stock model did not learn: {v_init:.3f} -> {v_ref:.3f}"
    print(f"validation loss: init {v_init:.4f}, stock fp32 {v_ref:.4f}, exact-v1 {v_exact:.4f}")
    assert abs(v_exact - v_ref) <= 0.02 * v_ref, f"exact-v1 {v_exact:.4f} vs stock fp32 {v_ref:.4f}"
