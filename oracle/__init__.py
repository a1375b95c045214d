"""The exact-v1 oracle: exact arithmetic, models, optimizers, RNG, the step function.

`init_state`, `TrainState` and the modules `step` and `norm_bucket` load on first use, so importing
the package (as `pot --help` does through oracle.cli) does not import torch. The functions are
`oracle.step.step(...)` and `oracle.norm_bucket.norm_bucket(...)`.
"""

from __future__ import annotations

import importlib

__all__ = ["TrainState", "init_state", "norm_bucket", "step"]

_LAZY = {
    "TrainState": ("oracle.state", "TrainState"),
    "init_state": ("oracle.step", "init_state"),
}


def __getattr__(name: str):
    if name in ("step", "norm_bucket"):
        return importlib.import_module("oracle." + name)
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'oracle' has no attribute {name!r}")
