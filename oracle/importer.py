"""Importers of Hugging Face checkpoints (safetensors layout) for fine-tuning from a committed
pretrained state.

`import_checkpoint("hf-gpt2" | "hf-llama", DIR)` reads DIR/config.json and DIR/model.safetensors
(or the shards named by DIR/model.safetensors.index.json), maps transformers' own parameter names
onto the model's (GPT-2's Conv1D weights are stored [in, out] and are transposed), widens every
tensor to float32, and returns the spec's [model] table and the parameters in canonical order.
Nothing is downloaded: the directory is what `save_pretrained` or a hub snapshot wrote.

A parameters file (`write_params`) holds those tensors under their model names; its digest
(`params_digest`, BLAKE3 over the tensors as a state digest of "param/<name>" entries in
canonical order) is what a fine-tune spec's [init] commits to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from commitments.files import atomic_write_bytes
from commitments.spec import ModelSpec, Spec, toml_table
from commitments.tensors import state_digest
from oracle import models

PARAMS_FORMAT = "pot/params/v1"
SOURCES = ("hf-gpt2", "hf-llama")
MAX_CONFIG_BYTES = 1 << 20
MAX_INDEX_BYTES = 16 << 20


class ImportRefused(ValueError):
    """A checkpoint or parameters file that cannot be used, with the file and the reason."""


def _read_json(path: Path, limit: int) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ImportRefused(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size > limit:
        raise ImportRefused(f"{path}: {size} bytes, more than the {limit} a checkpoint's JSON may hold")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImportRefused(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(obj, dict):
        raise ImportRefused(f"{path}: not a JSON object")
    return obj


def _load_tensors(d: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    single, index = d / "model.safetensors", d / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        wm = _read_json(index, MAX_INDEX_BYTES).get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise ImportRefused(f"{index}: no weight_map of tensor names to shard files")
        files = []
        for name in sorted(set(wm.values())):
            p = (d / name).resolve()
            if p.parent != d.resolve():
                raise ImportRefused(f"{index}: shard {name!r} is outside {d}")
            files.append(p)
    else:
        raise ImportRefused(f"{d}: neither model.safetensors nor model.safetensors.index.json "
                            f"(only the safetensors layout is read)")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(str(f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise ImportRefused(f"{f}: not a readable safetensors file ({exc})") from None
        for k, v in part.items():
            if k in out:
                raise ImportRefused(f"{f}: tensor {k!r} appears in two shards")
            out[k] = v
    return out


def _need(cfg: dict[str, Any], key: str, where: Path, kind=int) -> Any:
    v = cfg.get(key)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ImportRefused(f"{where}: {key} must be a {kind.__name__}, got {v!r}")
    return v


def _refuse_unless(cond: bool, where: Path, why: str) -> None:
    if not cond:
        raise ImportRefused(f"{where}: {why}")


# GPT-2's Conv1D modules store their weight [in, out]; a linear weight is [out, in].
GPT2_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of older checkpoints
GPT2_TABLES = {"wte.weight": "wte", "wpe.weight": "wpe"}  # the embedding tables' names here

Mapped = tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, str], tuple[str, ...]]


def _gpt2(d: Path, cfg: dict[str, Any]) -> Mapped:
    where = d / "config.json"
    C = _need(cfg, "n_embd", where)
    act = cfg.get("activation_function", "gelu_new")
    forms = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "erf"}
    _refuse_unless(act in forms, where, f"activation_function {act!r} is not a GELU form this model has")
    _refuse_unless(
        cfg.get("n_inner") in (None, 4 * C), where, f"n_inner {cfg.get('n_inner')!r} != 4 * n_embd"
    )
    _refuse_unless(float(cfg.get("layer_norm_epsilon", 1e-5)) == models.LN_EPS, where,
                   f"layer_norm_epsilon {cfg.get('layer_norm_epsilon')!r} != {models.LN_EPS}")
    _refuse_unless(cfg.get("scale_attn_weights", True) is True, where, "scale_attn_weights must be true")
    _refuse_unless(not cfg.get("scale_attn_by_inverse_layer_idx", False), where,
                   "scale_attn_by_inverse_layer_idx is not supported")
    _refuse_unless(not cfg.get("add_cross_attention", False), where, "cross-attention is not supported")
    model = {"kind": "gpt", "vocab_size": _need(cfg, "vocab_size", where),
             "block_size": _need(cfg, "n_positions", where), "n_layer": _need(cfg, "n_layer", where),
             "n_head": _need(cfg, "n_head", where), "n_embd": C, "bias": True,
             "tie_weights": bool(cfg.get("tie_word_embeddings", True)), "gelu": forms[act],
             "init_std": float(cfg.get("initializer_range", 0.02))}
    raw = _load_tensors(d)
    raw = {k: v for k, v in raw.items() if not k.endswith(GPT2_BUFFERS)}
    src = {}
    for k in raw:
        ours = k[len("transformer."):] if k.startswith("transformer.") else k
        src[GPT2_TABLES.get(ours, ours)] = k
    return model, raw, src, GPT2_CONV1D


def _llama(d: Path, cfg: dict[str, Any]) -> Mapped:
    where = d / "config.json"
    C, H = _need(cfg, "hidden_size", where), _need(cfg, "num_attention_heads", where)
    _refuse_unless(
        cfg.get("hidden_act", "silu") == "silu", where, f"hidden_act {cfg.get('hidden_act')!r} != 'silu'"
    )
    _refuse_unless(not cfg.get("attention_bias", False), where, "attention_bias is not supported (no biases)")
    _refuse_unless(not cfg.get("mlp_bias", False), where, "mlp_bias is not supported (no biases)")
    _refuse_unless(cfg.get("head_dim") in (None, C // H), where,
                   f"head_dim {cfg.get('head_dim')!r} != hidden_size / num_attention_heads")
    rope = cfg.get("rope_parameters") or {}
    _refuse_unless(isinstance(rope, dict), where, "rope_parameters must be an object")
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    _refuse_unless(
        not scaling, where, f"rope scaling {scaling!r} is not supported (plain rotary embeddings only)"
    )
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    _refuse_unless(isinstance(theta, int | float) and not isinstance(theta, bool), where,
                   f"rope_theta must be a number, got {theta!r}")
    model = {
        "kind": "llama",
        "vocab_size": _need(cfg, "vocab_size", where),
        "block_size": _need(cfg, "max_position_embeddings", where),
        "n_layer": _need(cfg, "num_hidden_layers", where),
        "n_head": H,
        "n_kv_head": cfg.get("num_key_value_heads") or H,
        "n_embd": C,
        "intermediate_size": _need(cfg, "intermediate_size", where),
        "tie_weights": bool(cfg.get("tie_word_embeddings", False)),
        "rope_theta": float(theta),
        "rms_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "init_std": float(cfg.get("initializer_range", 0.02)),
    }
    raw = _load_tensors(d)
    src = {(k[len("model."):] if k.startswith("model.") else k): k for k in raw}
    return model, raw, src, ()


def import_checkpoint(
    source: str, directory: str | os.PathLike[str]
) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(the [model] spec, float32 parameters in canonical order) of a Hugging Face checkpoint."""
    if source not in SOURCES:
        raise ImportRefused(f"unknown checkpoint source {source!r}; expected one of {', '.join(SOURCES)}")
    d = Path(directory)
    if not d.is_dir():
        raise ImportRefused(f"{d}: not a directory")
    cfg = _read_json(d / "config.json", MAX_CONFIG_BYTES)
    want_type = "gpt2" if source == "hf-gpt2" else "llama"
    if cfg.get("model_type") != want_type:
        raise ImportRefused(f"{d / 'config.json'}: model_type is {cfg.get('model_type')!r}, {source} needs "
                            f"{want_type!r}")
    model_d, raw, src, conv1d = (_gpt2 if source == "hf-gpt2" else _llama)(d, cfg)
    try:
        mspec = ModelSpec.model_validate(model_d)
    except ValueError as exc:
        raise ImportRefused(f"{d / 'config.json'}: gives no valid model spec: {exc}") from None
    specs = models.build(mspec).param_specs()
    params: dict[str, torch.Tensor] = {}
    used = set()
    for p in specs:
        key = src.get(p.name)
        if key is None:
            raise ImportRefused(f"{d}: the checkpoint has no tensor for {p.name} (transformers name "
                                f"{_hf_name(source, p.name)!r})")
        t = raw[key]
        used.add(key)
        if not t.is_floating_point():
            raise ImportRefused(f"{d}: {key} has dtype {t.dtype}, not a floating-point type")
        if conv1d and p.name.endswith(conv1d):
            t = t.t()  # Conv1D stores [in, out]; a linear weight is [out, in]
        if tuple(t.shape) != p.shape:
            raise ImportRefused(f"{d}: {key} has shape {tuple(t.shape)}, the config needs {p.shape}")
        t = t.to(torch.float32).contiguous()
        if not bool(torch.isfinite(t).all()):
            raise ImportRefused(f"{d}: {key} holds non-finite values")
        params[p.name] = t
    extra = sorted(set(raw) - used)
    if mspec.tie_weights:
        extra = [k for k in extra if k != "lm_head.weight"]  # a tied head saved anyway is the embedding
    if extra:
        raise ImportRefused(f"{d}: tensors the model has no place for: {', '.join(extra[:5])}"
                            f"{' ...' if len(extra) > 5 else ''}")
    return mspec, params


def our_name(source: str, hf_name: str) -> tuple[str, bool]:
    """(the model's name for transformers' parameter `hf_name`, whether it is stored transposed)."""
    if source == "hf-llama":
        return (hf_name[len("model."):] if hf_name.startswith("model.") else hf_name), False
    ours = hf_name[len("transformer."):] if hf_name.startswith("transformer.") else hf_name
    ours = GPT2_TABLES.get(ours, ours)
    return ours, ours.endswith(GPT2_CONV1D)


def _hf_name(source: str, name: str) -> str:
    if source == "hf-llama":
        return name if name == "lm_head.weight" else "model." + name
    hf = {v: k for k, v in GPT2_TABLES.items()}.get(name, name)
    return name if name == "lm_head.weight" else "transformer." + hf


# --- parameters files --------------------------------------------------------------------------


def params_digest(params: dict[str, torch.Tensor]) -> bytes:
    """State digest of the entries ("param/<name>", tensor) in the given (canonical) order."""
    return state_digest([("param/" + n, t) for n, t in params.items()])


def write_params(path: str | os.PathLike[str], model: ModelSpec, params: dict[str, torch.Tensor]) -> bytes:
    """Write a parameters file atomically; returns its params digest."""
    from safetensors.torch import save

    meta = {"format": PARAMS_FORMAT, "order": ",".join(params),
            "model": json.dumps(model.canonical(), sort_keys=True)}
    atomic_write_bytes(path, save({n: t.contiguous() for n, t in params.items()}, metadata=meta))
    return params_digest(params)


def read_params(path: str | os.PathLike[str], spec: Spec) -> dict[str, torch.Tensor]:
    """The parameters of a parameters file, in the canonical order of `spec`'s model, checked
    against the spec's shapes and (when the spec has one) its [init] params digest."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    p = Path(path)
    try:
        loaded = load(p.read_bytes())
    except OSError as exc:
        raise ImportRefused(f"{p}: cannot read parameters file: {exc.strerror or exc}") from None
    except (SafetensorError, ValueError, TypeError, RuntimeError) as exc:
        raise ImportRefused(f"{p}: not a safetensors file ({exc})") from None
    specs = models.build(spec.model, matmul=spec.exact.matmul).param_specs()
    want = [s.name for s in specs]
    missing, extra = [n for n in want if n not in loaded], sorted(set(loaded) - set(want))
    if missing or extra:
        raise ImportRefused(
            f"{p}: does not fit the spec's model (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    out = {}
    for s in specs:
        t = loaded[s.name]
        if t.dtype != torch.float32 or tuple(t.shape) != s.shape:
            raise ImportRefused(
                f"{p}: {s.name} is {t.dtype} {tuple(t.shape)}, the spec needs float32 {s.shape}"
            )
        out[s.name] = t
    if spec.init is not None:
        got = params_digest(out).hex()
        if got != spec.init.params_digest:
            raise ImportRefused(f"{p}: params digest {got[:16]}... is not the spec's init.params_digest "
                                f"{spec.init.params_digest[:16]}...")
    return out


def model_toml(model: ModelSpec) -> str:
    """The [model] table of a spec, as TOML: the fields of the model's kind (no `hidden` for a GPT),
    which load back to this model spec."""
    return toml_table("model", model.table())


__all__ = ["ImportRefused", "import_checkpoint", "model_toml", "params_digest", "read_params",
           "write_params", "PARAMS_FORMAT", "SOURCES"]
