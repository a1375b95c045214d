"""The leaf list a node fetches from a prover: challenges.opening.decode_leaves, then what
node.pipeline.stage_losschecks does with it (verify_leaves against the list's own root, the
committed losses, the loss checks). Refusal: LeavesRefused."""

from __future__ import annotations

from challenges.losschecks import run_loss_checks
from challenges.opening import LeavesRefused, committed_losses, decode_leaves, encode_leaves, verify_leaves
from commitments import merkle


def TestOneInput(data: bytes) -> None:
    try:
        leaves = decode_leaves(data)
    except LeavesRefused:
        return
    # The list's own root, so that the leaf parsing and the loss checks are reached.
    root = merkle.root(leaves) if leaves else bytes(32)
    try:
        parsed = verify_leaves(data, root, max(1, len(leaves)))
    except LeavesRefused:
        return
    run_loss_checks(committed_losses(parsed)).to_dict()


def seeds() -> dict[str, bytes]:
    from commitments.leaves import step_leaf

    honest = [step_leaf(t, bytes([t]) * 32, 0 if t == 0 else 0x40800000 - t * 4096) for t in range(6)]
    odd = [
        step_leaf(0, b"\0" * 32, 0),
        step_leaf(1, b"\1" * 32, 0x7F800000),
        step_leaf(2, b"\2" * 32, 0x00000001),
    ]
    return {"honest": encode_leaves(honest), "odd-losses": encode_leaves(odd), "empty": encode_leaves([])}
