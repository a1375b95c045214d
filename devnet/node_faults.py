"""Faulty verifier nodes for test and demo networks: the hooks node/hooks.py leaves open.

* `noise`: reveals a random value, proof and bucket instead of its replay's (a broken node: it
  ends an outlier).
* `lazy`: never fetches nor replays; reveals the public half it can read off the chain, H(leaf t),
  with a proof hash it cannot know (a lazy node: it pays as an outlier wherever a replayer wins).
* `kill_at`: SIGKILLs its own process right after a point became durable (a power cut).

The harnesses start such a node with `pot devnet node --fault ... --kill-at ... --config ...`;
`pot node run` never takes a fault.
"""

from __future__ import annotations

import logging
import os
import random
import signal

from commitments.hashing import digest
from node.hooks import KILL_POINTS, ForcedWitness, NodeHooks
from node.logs import log_event

log = logging.getLogger("devnet.node_faults")

FAULTS = ("none", "noise", "lazy")
LAZY_PROOF_DOMAIN = "pot/fault/lazy-proof/v1"


class FaultHooks(NodeHooks):
    """A node with `fault` ("none", "noise" or "lazy") that dies right after `kill_at` (a point of
    node.hooks.KILL_POINTS, or None: it never dies)."""

    def __init__(self, fault: str = "none", kill_at: str | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, not {fault!r}")
        if kill_at is not None and kill_at not in KILL_POINTS:
            raise ValueError(f"kill_at must be one of {', '.join(KILL_POINTS)}, not {kill_at!r}")
        self.fault = fault
        self.kill_at = kill_at

    def skips_work(self) -> bool:
        return self.fault == "lazy"

    def witness(self, *, challenge_id: bytes, account: str, leaf_hash: bytes,
                declared_bucket: int | None) -> ForcedWitness | None:
        if self.fault == "noise":
            return ForcedWitness(os.urandom(32), os.urandom(32), random.randint(-(2**31) + 1, 2**31 - 1))
        if self.fault == "lazy":
            return ForcedWitness(leaf_hash, digest(LAZY_PROOF_DOMAIN, challenge_id, account),
                                 declared_bucket if declared_bucket is not None else 0)
        return None

    def reached(self, point: str) -> None:
        if point == self.kill_at:
            log_event(log, "fault_kill", level=logging.WARNING, point=point)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["FAULTS", "LAZY_PROOF_DOMAIN", "FaultHooks"]
