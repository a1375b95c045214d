"""The canonical execution spec: what a step computes, encoded as deterministic CBOR.

The spec digest is what a miner commits to. Specs are read from TOML; unknown fields and
inconsistent settings are refused with a reason (`SpecError`), never silently defaulted away.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import digest

SPEC_VERSION = "pot/spec/v1"


class SpecError(CommitmentError):
    """A spec that cannot be used, with the field and the reason."""


class _Strict(BaseModel):
    # strict: a TOML `steps = true` or `bias = "yes"` is a mistake to refuse, not a value to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    # Fields added after the first specs were committed: the canonical form leaves each out while
    # it holds its default, so a spec written before the field existed keeps its bytes and digest.
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()

    def canonical(self) -> dict[str, Any]:
        """Plain dict of every field (defaults included, except OMIT_AT_DEFAULT ones at default)."""
        d = self.model_dump(mode="python")
        for name in self.OMIT_AT_DEFAULT:
            if getattr(self, name) == type(self).model_fields[name].default:
                del d[name]
        return d


# Fields of the Llama family only; a GPT or MLP spec refuses them and omits them from its canonical
# form, so the encoding of those specs is unchanged.
LLAMA_FIELDS = ("n_kv_head", "intermediate_size", "rope_theta", "rms_eps")
# Fields a Llama spec refuses (it has no biases, a SwiGLU MLP, no token-level hidden widths).
NOT_LLAMA_FIELDS = ("hidden", "bias", "gelu")
ROPE_MAX_POSITIONS = 1 << 20


class ModelSpec(_Strict):
    kind: Literal["gpt", "mlp", "llama"] = "gpt"
    vocab_size: int = Field(256, gt=0)
    block_size: int = Field(64, gt=0, description="context length (positions)")
    n_layer: int = Field(2, gt=0)
    n_head: int = Field(4, gt=0)
    n_embd: int = Field(128, gt=0)
    # MLP only: hidden widths of a token-level MLP language model (embedding -> hidden -> vocab).
    hidden: tuple[Annotated[int, Field(gt=0)], ...] = Field((256,), strict=False)  # TOML gives a list
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True
    tie_weights: bool = True
    gelu: Literal["tanh", "erf"] = "tanh"
    init_std: float = Field(0.02, gt=0.0)
    # Llama only (None elsewhere): key/value heads (grouped-query attention; default n_head), the
    # SwiGLU width, the rotary base and the RMSNorm epsilon.
    n_kv_head: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    rope_theta: float | None = Field(None, gt=1.0)
    rms_eps: float | None = Field(None, gt=0.0)

    @model_validator(mode="before")
    @classmethod
    def _llama_defaults(cls, data: Any) -> Any:
        """A Llama spec's optional fields take their defaults here, so that a spec and the one
        decoded from its CBOR are equal."""
        if isinstance(data, dict) and data.get("kind") == "llama":
            data = dict(data)
            if data.get("n_kv_head") is None and isinstance(data.get("n_head", 4), int):
                data["n_kv_head"] = data.get("n_head", 4)
            data.setdefault("rope_theta", 10000.0)
            data.setdefault("rms_eps", 1e-6)
        return data

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.kind in ("gpt", "llama") and self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.kind != "llama":
            given = [f for f in LLAMA_FIELDS if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only for kind 'llama'")
            return self
        wrong = [
            f for f in NOT_LLAMA_FIELDS if f in self.model_fields_set and not (f == "bias" and not self.bias)
        ]
        if wrong:
            raise ValueError(f"{', '.join(wrong)}: not a field of kind 'llama' (no biases, SwiGLU MLP)")
        if self.intermediate_size is None:
            raise ValueError("intermediate_size: required for kind 'llama' (the SwiGLU MLP's width)")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head})")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"the head size n_embd / n_head ({self.n_embd // self.n_head}) must be even (rotary)"
            )
        if self.block_size > ROPE_MAX_POSITIONS:
            raise ValueError(
                f"block_size ({self.block_size}) exceeds {ROPE_MAX_POSITIONS} positions, the range "
                f"of the exact rotary tables"
            )
        return self

    def canonical(self) -> dict[str, Any]:
        """Plain dict of the fields that define this kind (defaults included)."""
        d = self.model_dump(mode="python")
        d["hidden"] = list(d["hidden"])
        if self.kind != "llama":
            for f in LLAMA_FIELDS:
                del d[f]
            return d
        for f in NOT_LLAMA_FIELDS:
            del d[f]
        return d

    def table(self) -> dict[str, Any]:
        """The [model] table a spec file needs for this model: the canonical fields, less those its
        kind never reads while they hold their default (a GPT's `hidden`); the spec it loads to is
        this one."""
        d = self.canonical()
        for f in UNUSED_BY_KIND.get(self.kind, ()):
            if getattr(self, f) == type(self).model_fields[f].default:
                del d[f]
        return d


# Fields the canonical form of a kind holds though its model never reads them (they are in every
# GPT and MLP spec's digest since the first specs): a printed [model] table leaves them out at default.
UNUSED_BY_KIND = {"gpt": ("hidden",)}
# The same among the optimizer's fields (each optimizer reads its own hyperparameters).
UNUSED_BY_OPTIMIZER = {"adamw": ("momentum",), "sgd": ("beta1", "beta2", "eps")}


class OptimizerSpec(_Strict):
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("schedule", "warmup_steps", "decay_steps", "min_lr")

    kind: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0.0, description="peak learning rate")
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0, description="matrices and embeddings only (docs/exact-v1.md §8)")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD only")
    grad_clip: float = Field(1.0, ge=0.0, description="global-norm clip; 0 disables")
    # The learning-rate schedule (docs/exact-v1.md §8.1): the rate of step t is a pure function of t.
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="after the warm-up: constant lr, cosine or linear decay to min_lr")
    warmup_steps: int = Field(0, ge=0, lt=2**32, description="steps 1..warmup_steps ramp linearly up to lr")
    decay_steps: int = Field(
        0,
        ge=0,
        lt=2**32,
        description="cosine/linear: the step (warm-up included) where the rate reaches min_lr",
    )
    min_lr: float = Field(0.0, ge=0.0, description="cosine/linear: the floor the rate decays to")

    @model_validator(mode="after")
    def _schedule_consistent(self) -> OptimizerSpec:
        if self.schedule == "constant":
            if self.decay_steps or self.min_lr:
                raise ValueError("decay_steps and min_lr have no effect under schedule 'constant'; "
                                 "use schedule = 'cosine' or 'linear'")
        else:
            if self.decay_steps <= self.warmup_steps:
                raise ValueError(f"schedule '{self.schedule}' needs decay_steps ({self.decay_steps}) > "
                                 f"warmup_steps ({self.warmup_steps})")
            if self.min_lr > self.lr:
                raise ValueError(f"min_lr ({self.min_lr}) exceeds lr ({self.lr})")
        return self


class BatchSpec(_Strict):
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("micro_batches",)

    batch_size: int = Field(8, gt=0, description="sequences per step")
    seq_len: int = Field(64, gt=0, description="tokens per sequence (a sample holds seq_len + 1)")
    # Gradient accumulation: the miner's split of each step's batch into micro-batches of whole,
    # consecutive sequences. Under exact-v1 every split has the same bytes, so a verifier may
    # replay with another split; under torch-native the split is part of the arithmetic.
    micro_batches: int = Field(1, gt=0, description="micro-batches per step (gradient accumulation)")

    @model_validator(mode="after")
    def _split_fits(self) -> BatchSpec:
        if self.micro_batches > self.batch_size:
            raise ValueError(f"micro_batches ({self.micro_batches}) exceeds batch_size ({self.batch_size}): "
                             f"a micro-batch holds at least one sequence")
        return self


class RngSpec(_Strict):
    seed: int = Field(0, ge=0, lt=2**64, description="base seed: initialisation, dropout")
    schedule_seed: int = Field(0, ge=0, lt=2**64, description="seed of the sample schedule")
    policy: Literal["none", "philox-v1"] = Field(
        "philox-v1", description="per-step keying: Philox4x32-10 keyed by (seed, step, op site, index)"
    )


class ExactSpec(_Strict):
    matmul: Literal["single", "hilo"] = "single"


class InitSpec(_Strict):
    """The initial state is a pretrained one (a fine-tune), not drawn from the seed: its
    parameters are those whose params digest is given, its moments zero, its step 0."""

    kind: Literal["pretrained"] = "pretrained"
    params_digest: str = Field(pattern=r"^[0-9a-f]{64}$",
                               description="BLAKE3 state digest of the ('param/<name>', tensor) entries, hex")


class HardwareClass(_Strict):
    device: str = Field(min_length=1)
    isa: str = ""
    threads: int = Field(1, gt=0)
    torch: str = ""


class Spec(_Strict):
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("init",)
    version: Literal["pot/spec/v1"] = SPEC_VERSION
    profile: Literal["exact-v1", "torch-native"] = "exact-v1"
    # "bf16-mixed": float32 master weights and moments, bf16 rounding of matrix-product operands
    # and outputs (docs/exact-v1.md §12).
    dtype: Literal["float32", "bf16-mixed"] = "float32"
    loss: Literal["cross-entropy"] = "cross-entropy"
    steps: int = Field(100, gt=0, description="declared number of training steps")
    model: ModelSpec = ModelSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    batch: BatchSpec = BatchSpec()
    rng: RngSpec = RngSpec()
    exact: ExactSpec = ExactSpec()
    hardware: HardwareClass | None = None
    init: InitSpec | None = None  # absent: parameters from Philox(seed); a spec without it encodes as before

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        if self.model.dropout > 0 and self.rng.policy == "none":
            raise ValueError("non-zero dropout needs an RNG seed policy (rng.policy = 'philox-v1')")
        if self.profile == "torch-native" and self.hardware is None:
            raise ValueError("profile 'torch-native' is exact only on one hardware class: add [hardware]")
        if self.model.kind in ("gpt", "llama") and self.batch.seq_len > self.model.block_size:
            raise ValueError(
                f"batch.seq_len ({self.batch.seq_len}) exceeds model.block_size ({self.model.block_size})"
            )
        return self

    # --- canonical form -------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """Plain dict of every field (defaults included, but for fields added later while they
        hold their default: see _Strict.OMIT_AT_DEFAULT), the input to CBOR."""
        d = super().canonical()
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, _Strict):
                d[name] = value.canonical()
        return d

    def to_cbor(self) -> bytes:
        return cbor.encode(self.canonical())

    def digest(self) -> bytes:
        return digest("pot/spec/v1", self.canonical())

    def canonical_toml(self, source: str = "") -> str:
        """The canonical form as a spec file: every field the digest covers, defaults filled in, in
        declaration order. A field the digest leaves out at its default (OMIT_AT_DEFAULT) and a null
        (TOML has none) are comment lines, so the file loads back to this spec and this digest."""
        of = f" of {source}" if source else ""
        lines = [
            f"# The canonical form{of}: spec digest {self.digest().hex()}.",
            "# Every field the digest covers, defaults included. A commented field is one the digest",
            "# leaves out at its default (writing it changes nothing), or a null, which TOML cannot hold.",
        ]
        tables: list[tuple[str, _Strict]] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, _Strict):
                tables.append((name, value))
            elif value is None and name in type(self).OMIT_AT_DEFAULT:
                lines.append(f"# [{name}] absent: {ABSENT_TABLES.get(name, 'at its default')}")
            elif value is None:
                lines.append(f"# {name} = null: no [{name}] table")
            else:
                lines.append(f"{name} = {toml_value(value)}")
        for name, sub in tables:
            body = sub.canonical()
            unused = (UNUSED_BY_KIND if name == "model" else UNUSED_BY_OPTIMIZER if name == "optimizer"
                      else {}).get(getattr(sub, "kind", ""), ())
            lines += ["", f"[{name}]"]
            lines += [
                f"{k} = {toml_value(v)}"
                + (f"  # unused by kind \"{sub.kind}\", in the digest all the same" if k in unused else "")
                for k, v in body.items()
            ]
            lines += [f"# {k} = {toml_value(getattr(sub, k))}" for k in type(sub).model_fields
                      if k not in body and k in type(sub).OMIT_AT_DEFAULT]
        return "\n".join(lines) + "\n"

    @property
    def sample_len(self) -> int:
        """Tokens per dataset sample: inputs plus the shifted target."""
        return self.batch.seq_len + 1

    # --- loading --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "spec") -> Spec:
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            reasons = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "(spec)"
                msg = err["msg"]
                if err["type"] == "extra_forbidden":
                    msg = "unknown field"
                reasons.append(f"{loc}: {msg}")
            raise SpecError(f"{source}: invalid spec: " + "; ".join(reasons)) from None
        try:
            # A spec is committed by its CBOR: one the encoder refuses (an integer past 64 bits)
            # could never be registered, hashed or opened.
            spec.to_cbor()
        except CommitmentError as exc:
            raise SpecError(f"{source}: invalid spec: {exc}") from None
        return spec

    @classmethod
    def from_toml(cls, path: str | Path) -> Spec:
        return cls.from_dict(read_toml(path), source=str(path))

    @classmethod
    def from_cbor(cls, data: bytes) -> Spec:
        obj = cbor.decode(data)
        if not isinstance(obj, dict):
            raise SpecError("spec CBOR is not a map")
        return cls.from_dict(obj, source="spec CBOR")


# What an absent table of the canonical form means (comment lines of Spec.canonical_toml).
ABSENT_TABLES = {"init": "the initial parameters are drawn from rng.seed"}


def read_toml(path: str | Path) -> dict[str, Any]:
    """A spec file's TOML as a dict (not yet validated)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{p}: cannot read spec: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{p}: not valid TOML: {exc}") from None


def filled_defaults(spec: Spec, given: dict[str, Any]) -> dict[str, Any]:
    """The fields of `spec`'s canonical form that `given` (the dict it was loaded from) did not
    name, by dotted path, with the default each took."""
    out: dict[str, Any] = {}

    def walk(canonical: dict[str, Any], raw: Any, prefix: str) -> None:
        for k, v in canonical.items():
            here = raw.get(k) if isinstance(raw, dict) else None
            if isinstance(v, dict) and isinstance(here, dict):
                walk(v, here, f"{prefix}{k}.")
            elif isinstance(v, dict):
                walk(v, None, f"{prefix}{k}.")
            elif not isinstance(raw, dict) or k not in raw:
                out[prefix + k] = v

    walk(spec.canonical(), given, "")
    return out


def toml_value(v: Any) -> str:
    """A canonical spec value as TOML (text, a boolean, an integer, a float, an array of those)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise SpecError(f"no TOML form for a {type(v).__name__} ({v!r})")


def toml_table(name: str, fields: dict[str, Any]) -> str:
    """`[name]` and one `key = value` line per field."""
    return "\n".join([f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in fields.items())]) + "\n"
