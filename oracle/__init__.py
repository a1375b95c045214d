"""The exact-v1 oracle: exact arithmetic, models, optimizers, RNG, the step function.

`step`, `init_state`, `TrainState` and `norm_bucket` load on first use, so importing the package
(as `pot --help` does through oracle.cli) does not import torch.
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
        # These submodules are callable as their function (see their ends), so `oracle.step(...)`
        # works whether the package attribute holds the module or the function.
        return importlib.import_module("oracle." + name)
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'oracle' has no attribute {name!r}")
