"""Hugging Face checkpoints against transformers' own code: randomly initialised GPT2LMHeadModel
and LlamaForCausalLM models are saved with save_pretrained and imported; our forward under
torch-native and exact-v1 gives transformers' float32 logits and loss, and one AdamW step under
torch-native gives torch.optim.AdamW's parameters. Nothing is downloaded."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from commitments.spec import Spec
from oracle import importer, models, native, optim
from oracle.exact import ops
from oracle.step import StepError, init_state, step

transformers = pytest.importorskip("transformers")

B, T = 3, 12
LOGIT_RTOL, LOSS_TOL = 1e-4, 1e-5


def _hf_gpt2(tie: bool = True):
    cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                  tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(1)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _hf_llama(tie: bool = False, kv: int = 2):
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv,
        max_position_embeddings=32,
        tie_word_embeddings=tie,
        rope_theta=10000.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    torch.manual_seed(2)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers' init is small; widen the weights so every op matters
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
            else:
                p.add_(0.1 * torch.randn_like(p))
    return m


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (B, T + 1), generator=torch.Generator().manual_seed(seed))


def _spec(model, params=None, profile="exact-v1") -> Spec:
    d = {"profile": profile, "model": model.canonical(), "batch": {"batch_size": B, "seq_len": T},
         "optimizer": {"lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0}, "steps": 4}
    if params is not None:
        d["init"] = {"params_digest": importer.params_digest(params).hex()}
    if profile == "torch-native":
        d["hardware"] = {"device": "cpu"}
    return Spec.from_dict(d)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


CASES = [("hf-gpt2", lambda: _hf_gpt2(True)), ("hf-gpt2", lambda: _hf_gpt2(False)),
         ("hf-llama", lambda: _hf_llama(False, 2)), ("hf-llama", lambda: _hf_llama(True, 4)),
         ("hf-llama", lambda: _hf_llama(False, 1))]


@pytest.mark.parametrize(
    "source, make", CASES, ids=["gpt2-tied", "gpt2-untied", "llama-gqa", "llama-tied", "llama-mqa"]
)
def test_forward_and_loss_match_transformers(tmp_path, source, make):
    hf = make()
    hf.save_pretrained(tmp_path)
    model, params = importer.import_checkpoint(source, tmp_path)
    tokens = _tokens()
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        ref = hf(input_ids=x).logits
    ref_loss = F.cross_entropy(ref.reshape(-1, ref.shape[-1]), y.reshape(-1))
    net = models.build(model)
    for name, namespace in (("torch-native", native), ("exact-v1", ops)):
        with torch.no_grad():
            logits = net.forward(namespace, params, x)
            loss = namespace.cross_entropy(logits, y)
        assert _rel(logits, ref) < LOGIT_RTOL, (name, _rel(logits, ref))
        assert abs(loss.item() - ref_loss.item()) < LOSS_TOL, (name, loss.item(), ref_loss.item())


@pytest.mark.parametrize("source, make", [CASES[0], CASES[2]], ids=["gpt2", "llama"])
def test_one_adamw_step_matches_torch_adamw(tmp_path, source, make):
    """The step's loss and gradients are transformers' (float32 differences of the two forwards);
    the update applied to transformers' gradients is torch.optim.AdamW's within float32 rounding."""
    hf = make()
    hf.save_pretrained(tmp_path / "before")
    model, params = importer.import_checkpoint(source, tmp_path / "before")
    spec = _spec(model, params, "torch-native")
    tokens = _tokens(1)
    after, loss = step(init_state(spec, pretrained=params), tokens, spec, 1)

    logits = hf(input_ids=tokens[:, :-1]).logits
    ref_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < LOSS_TOL
    hf_grads = {}
    for n, p in hf.named_parameters():
        ours, transposed = importer.our_name(source, n)
        hf_grads[ours] = (p.grad.t() if transposed else p.grad).clone().contiguous()
    net = models.build(model)
    leaves = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    native.cross_entropy(net.forward(native, leaves, tokens[:, :-1]), tokens[:, 1:]).backward()
    for n, leaf in leaves.items():
        assert _rel(leaf.grad, hf_grads[n]) < LOGIT_RTOL, (n, _rel(leaf.grad, hf_grads[n]))

    o = spec.optimizer
    role = {p.name: p.role for p in net.param_specs()}
    named = dict(hf.named_parameters())
    decay = [
        p for n, p in named.items() if optim.decays(role[importer.our_name(source, n)[0]], tuple(p.shape))
    ]
    rest = [
        p for n, p in named.items() if not optim.decays(role[importer.our_name(source, n)[0]], tuple(p.shape))
    ]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
    )
    torch.nn.utils.clip_grad_norm_(hf.parameters(), o.grad_clip)
    opt.step()
    hf.save_pretrained(tmp_path / "after")
    _, want = importer.import_checkpoint(source, tmp_path / "after")
    names = list(params)
    with torch.no_grad():
        grads, _ = optim.clip(native, [hf_grads[n] for n in names], o.grad_clip)
        zeros = {m: [torch.zeros_like(params[n]) for n in names] for m in optim.moment_names(o)}
        new_p, _ = optim.update(
            o, 1, names, [params[n] for n in names], grads, zeros, [role[n] for n in names]
        )
    moved = 0
    for n, got in zip(names, new_p, strict=True):
        # float32 rounding of p * (1 - lr wd) - u: a few ulps of the operands p and u
        scale = params[n].abs() + (want[n] - params[n]).abs()
        err = (got - want[n]).abs()
        assert bool((err <= 4 * torch.finfo(torch.float32).eps * scale).all()), (n, err.max().item())
        moved += int((want[n] != params[n]).sum())
    assert moved > 0.9 * sum(t.numel() for t in params.values())
    # and the whole step moved the parameters as far as AdamW's step does
    step_ours = torch.cat([(after.params()[n] - params[n]).reshape(-1) for n in names])
    step_ref = torch.cat([(want[n] - params[n]).reshape(-1) for n in names])
    assert (step_ours - step_ref).norm() / step_ref.norm() < 0.05


def test_imported_parameters_are_a_committed_initial_state(tmp_path):
    _hf_llama().save_pretrained(tmp_path / "hf")
    model, params = importer.import_checkpoint("hf-llama", tmp_path / "hf")
    digest = importer.write_params(tmp_path / "init.safetensors", model, params).hex()
    base = _spec(model)
    spec = Spec.from_dict({**base.canonical(), "init": {"params_digest": digest}})
    assert spec.digest() != base.digest()
    assert Spec.from_cbor(spec.to_cbor()) == spec
    state = init_state(spec, pretrained=tmp_path / "init.safetensors")
    assert state.step == 0 and importer.params_digest(state.params()).hex() == digest
    assert state.digest() == init_state(spec, pretrained=params).digest()
    assert all(bool((t == 0).all()) for m in state.moments(spec).values() for t in m.values())
    with pytest.raises(StepError, match="give the parameters file"):
        init_state(spec)
    with pytest.raises(StepError, match="no \\[init\\]"):
        init_state(base, pretrained=params)
    other = {n: t.clone() for n, t in params.items()}
    other["norm.weight"][0] += 1.0
    with pytest.raises(StepError, match="is not the spec's init.params_digest"):
        init_state(spec, pretrained=other)
    importer.write_params(tmp_path / "other.safetensors", model, other)
    with pytest.raises(StepError, match="is not the spec's init.params_digest"):
        init_state(spec, pretrained=tmp_path / "other.safetensors")


def test_refusals_name_the_file_and_the_reason(tmp_path):
    hf = _hf_llama()
    hf.save_pretrained(tmp_path)
    with pytest.raises(importer.ImportRefused, match="model_type is 'llama', hf-gpt2 needs 'gpt2'"):
        importer.import_checkpoint("hf-gpt2", tmp_path)
    with pytest.raises(importer.ImportRefused, match="unknown checkpoint source"):
        importer.import_checkpoint("hf-bert", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(importer.ImportRefused, match="hidden_act 'gelu' != 'silu'"):
        importer.import_checkpoint("hf-llama", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 64}))
    with pytest.raises(importer.ImportRefused, match="mlp.gate_proj.weight has shape"):
        importer.import_checkpoint("hf-llama", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "linear"}}))
    with pytest.raises(importer.ImportRefused, match="rope scaling"):
        importer.import_checkpoint("hf-llama", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(importer.ImportRefused, match="neither model.safetensors"):
        importer.import_checkpoint("hf-llama", tmp_path)


def test_sharded_bf16_checkpoint(tmp_path):
    hf = _hf_gpt2().to(torch.bfloat16)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model, params = importer.import_checkpoint("hf-gpt2", tmp_path)
    assert all(t.dtype == torch.float32 for t in params.values())
    w = hf.transformer.h[0].attn.c_attn.weight.detach()
    assert torch.equal(params["h.0.attn.c_attn.weight"], w.float().t())  # Conv1D transposed, widened exactly
