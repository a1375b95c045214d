"""A mutated honest opening: the fuzz bytes are the manifest, framed with the honest pre-state,
then loaded and validated like any opening. Only OpeningRefused; only the honest manifest passes."""

from __future__ import annotations

import struct

from challenges.opening import MAGIC, load_opening
from tests.fuzz.targets import _opening

_PRE_STATE = load_opening(_opening.base()[0]).pre_state


def TestOneInput(data: bytes) -> None:
    _opening.check(MAGIC + struct.pack(">I", len(data)) + data + _PRE_STATE)


def seeds() -> dict[str, bytes]:
    from challenges.opening import encode_opening

    op = load_opening(_opening.base()[0])
    m = dict(op.manifest)
    step1 = dict(m, step=1)
    return {"valid-step2": op.manifest_bytes,
            "step-1": encode_opening(step1, b"")[len(MAGIC) + 4:]}
