"""commitments.leaves.parse_step_leaf on arbitrary bytes: a StepLeaf whose bytes are the input, or
LeafError."""

from __future__ import annotations

from commitments.leaves import LeafError, parse_step_leaf, step_leaf


def TestOneInput(data: bytes) -> None:
    try:
        leaf = parse_step_leaf(data)
    except LeafError:
        return
    if leaf.to_bytes() != data:
        raise AssertionError("a parsed step leaf does not encode back to its bytes")
    leaf.loss  # noqa: B018  (any accepted loss_bits must give a float)


def seeds() -> dict[str, bytes]:
    return {"initial": step_leaf(0, b"\1" * 32, 0), "step": step_leaf(7, b"\2" * 32, 0x3F800000),
            "nan": step_leaf(2**40, b"\3" * 32, 0x7FC00000)}
