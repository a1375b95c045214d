"""The training state: every tensor a step reads and writes, in one canonical order.

Order (defined here only): "param/<name>" in the model's order, then "opt/<moment>/<name>" moment
by moment in the same model order, then "step" (int64 scalar: steps done) and "rng/seed" (uint64
scalar: the Philox base seed). The state digest is commitments.tensors.state_digest over it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from commitments.files import PRIVATE, atomic_write_bytes
from commitments.spec import Spec
from commitments.tensors import state_digest
from oracle import models, optim

STATE_FORMAT = "pot/state/v1"


class StateError(ValueError):
    """A state that does not fit its spec (missing, extra, mis-shaped or wrong-dtype tensors)."""


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def param_specs(spec: Spec) -> list[models.ParamSpec]:
    return models.build(spec.model, matmul=spec.exact.matmul).param_specs()


def layout(spec: Spec) -> list[Slot]:
    """The canonical order of a state under `spec`."""
    ps = param_specs(spec)
    slots = [Slot("param/" + p.name, p.shape, torch.float32) for p in ps]
    for moment in optim.moment_names(spec.optimizer):
        slots += [Slot(f"opt/{moment}/{p.name}", p.shape, torch.float32) for p in ps]
    slots.append(Slot("step", (), torch.int64))
    slots.append(Slot("rng/seed", (), torch.uint64))
    return slots


class TrainState:
    """An ordered, immutable-by-convention mapping of state tensors (see module doc)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = dict(tensors)

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def assemble(cls, spec: Spec, params: dict[str, torch.Tensor],
                 moments: dict[str, dict[str, torch.Tensor]], step: int, seed: int) -> TrainState:
        """Put parts in canonical order; the result is checked against `spec`."""
        t: dict[str, torch.Tensor] = {}
        names = [p.name for p in param_specs(spec)]
        for n in names:
            t["param/" + n] = params[n]
        for moment in optim.moment_names(spec.optimizer):
            for n in names:
                t[f"opt/{moment}/{n}"] = moments[moment][n]
        device = next(iter(params.values())).device if params else None
        t["step"] = torch.tensor(step, dtype=torch.int64, device=device)
        t["rng/seed"] = torch.tensor(seed, dtype=torch.uint64, device=device)
        st = cls(t)
        st.check(spec)
        return st

    # --- views ----------------------------------------------------------------------------
    def items(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.tensors.items())

    def params(self) -> dict[str, torch.Tensor]:
        return {k[6:]: v for k, v in self.tensors.items() if k.startswith("param/")}

    def moments(self, spec: Spec) -> dict[str, dict[str, torch.Tensor]]:
        out = {}
        for moment in optim.moment_names(spec.optimizer):
            pre = f"opt/{moment}/"
            out[moment] = {k[len(pre):]: v for k, v in self.tensors.items() if k.startswith(pre)}
        return out

    @property
    def step(self) -> int:
        return int(self.tensors["step"].item())

    @property
    def seed(self) -> int:
        return int(self.tensors["rng/seed"].cpu().item())

    @property
    def device(self) -> torch.device:
        return self.tensors["step"].device

    def to(self, device) -> TrainState:
        return TrainState({k: v.to(device) for k, v in self.tensors.items()})

    def digest(self) -> bytes:
        return state_digest(self.items())

    # --- validation -----------------------------------------------------------------------
    def check(self, spec: Spec) -> None:
        """Refuse missing, extra, misplaced, mis-shaped and wrong-dtype tensors."""
        check_tensors(self.tensors.items(), spec, where="state")
        if self.seed != spec.rng.seed:
            raise StateError(f"state: rng/seed is {self.seed} but the spec's rng.seed is {spec.rng.seed}")
        if self.step < 0:
            raise StateError(f"state: step is {self.step}; it counts steps done and cannot be negative")

    # --- files ----------------------------------------------------------------------------
    def to_safetensors(self, path: str | os.PathLike[str]) -> None:
        """Write atomically and durably (commitments.files), readable by the owner only: a
        miner's states are its own until it opens them."""
        from safetensors.torch import save

        data = save({k: v.detach().cpu().contiguous() for k, v in self.tensors.items()},
                    metadata={"format": STATE_FORMAT, "order": ",".join(self.tensors)})
        atomic_write_bytes(path, data, mode=PRIVATE)

    @classmethod
    def from_safetensors(cls, path: str | os.PathLike[str], spec: Spec, *, device=None) -> TrainState:
        """Read a state file and check it against `spec`; the canonical order comes from the spec."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise StateError(f"{p}: cannot read state file: {exc.strerror or exc}") from None
        try:
            loaded = load(raw)
        except (SafetensorError, ValueError, TypeError, RuntimeError) as exc:
            raise StateError(f"{p}: not a safetensors file ({exc})") from None
        order = [s.name for s in layout(spec)]
        check_tensors(loaded.items(), spec, where=str(p), ordered=False)
        st = cls({n: loaded[n] if device is None else loaded[n].to(device) for n in order})
        try:
            st.check(spec)
        except StateError as exc:
            raise StateError(f"{p}: {exc}") from None
        return st


def check_tensors(items: Iterable[tuple[str, torch.Tensor]], spec: Spec, *, where: str,
                  ordered: bool = True) -> None:
    slots = layout(spec)
    want = {s.name: s for s in slots}
    got = dict(items)
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_few(missing)}")
        if extra:
            parts.append(f"unexpected {_few(extra)}")
        raise StateError(f"{where}: does not match the spec's state layout: " + "; ".join(parts))
    if ordered and list(got) != list(want):
        raise StateError(f"{where}: tensors are not in the canonical order")
    for name, slot in want.items():
        t = got[name]
        if not isinstance(t, torch.Tensor):
            raise StateError(f"{where}: {name} is a {type(t).__name__}, not a tensor")
        if t.dtype != slot.dtype:
            raise StateError(f"{where}: {name} has dtype {t.dtype}, expected {slot.dtype}")
        if tuple(t.shape) != slot.shape:
            raise StateError(f"{where}: {name} has shape {tuple(t.shape)}, expected {slot.shape}")


def _few(names: list[str]) -> str:
    s = ", ".join(names[:5])
    return s + (f" and {len(names) - 5} more" if len(names) > 5 else "")
