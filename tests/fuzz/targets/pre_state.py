"""challenges.opening.parse_state_bytes (the pre-state's safetensors parser, run on memory-mapped
bytes from a miner) against the honest opening's spec: a TrainState, or OpeningRefused."""

from __future__ import annotations

from challenges.opening import OpeningRefused, load_opening, parse_state_bytes
from commitments.spec import Spec
from tests.fuzz.targets import _opening

_SPEC = Spec.from_cbor(load_opening(_opening.base()[0]).spec_bytes)


def TestOneInput(data: bytes) -> None:
    try:
        state = parse_state_bytes(memoryview(data), _SPEC)
    except OpeningRefused as exc:
        if not exc.reason:
            raise AssertionError("a refusal must say why") from exc
        return
    state.digest()


def seeds() -> dict[str, bytes]:
    import json
    import struct

    pre = bytes(load_opening(_opening.base()[0]).pre_state)
    head = json.dumps({"__metadata__": {"format": "pot/state/v1"},
                       "x": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}}).encode()
    return {"honest": pre, "one-tensor": struct.pack("<Q", len(head)) + head + b"\0" * 8}
