"""Coverage-guided fuzz targets (atheris): one module per decoder, each with `TestOneInput(data)`.

A target feeds the bytes to one decoder and lets through only that decoder's documented refusal;
any other exception, a stall past the per-input timeout, or a broken round trip is a crash.
`tests/fuzz/engine.py` runs them; their seeds are in tests/fuzz/corpus/<target>/.
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = (
    "cbor",
    "remarks",
    "step_leaf",
    "leaf_list",
    "byte_strings",
    "opening_file",
    "opening_manifest",
    "opening_gate",
    "pre_state",
    "spec_cbor",
    "spec_toml",
    "snapshot",
    "recipe",
    "dev_block",
    "substrate_block",
    "vrf",
)


def load(name: str) -> ModuleType:
    if name not in TARGETS:
        raise KeyError(f"unknown fuzz target {name!r}; known: {', '.join(TARGETS)}")
    return importlib.import_module(f"tests.fuzz.targets.{name}")
