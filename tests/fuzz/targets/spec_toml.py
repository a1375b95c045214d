"""commitments.spec.Spec.from_toml on a file written from arbitrary bytes (an operator's or a
miner's spec file): a Spec, or SpecError."""

from __future__ import annotations

import os
import tempfile

from commitments.spec import Spec, SpecError

_DIR = tempfile.mkdtemp(prefix="pot-fuzz-spec-")
_PATH = os.path.join(_DIR, "spec.toml")


def TestOneInput(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        spec = Spec.from_toml(_PATH)
    except SpecError:
        return
    Spec.from_cbor(spec.to_cbor())


def seeds() -> dict[str, bytes]:
    return {
        "empty": b"",
        "mlp": b'steps = 6\n[model]\nkind = "mlp"\nblock_size = 16\nhidden = [32]\n'
               b'[batch]\nbatch_size = 4\nseq_len = 16\n[rng]\nseed = 7\nschedule_seed = 11\n',
        "gpt": b'steps = 2\n[model]\nkind = "gpt"\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 32\n',
        "cuda": b'profile = "torch-native"\n[hardware]\ndevice = "cuda"\nisa = "sm90"\nthreads = 1\n',
    }
