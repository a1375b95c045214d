"""Where a test network may steer a verifier daemon, and nothing more.

A production daemon runs with `NodeHooks()`, which steers nothing: it fetches, replays and
reveals what it computed, and never stops itself. Test and demo networks (devnet/node_faults.py)
pass a subclass to stand for a broken node (one that reveals noise), a lazy one (no fetch, no
replay) or a power cut right after a point became durable. None of this is in the node's config:
an operator cannot turn a fault on by mistake, and the production code path holds no fault logic.
"""

from __future__ import annotations

from dataclasses import dataclass

# The points right after which the daemon has made something durable, in the order a challenge
# reaches them: where a crash test cuts the power (node.daemon announces each to `reached`).
KILL_POINTS = ("event_ingested", "fetched", "validated", "replayed", "journaled", "commit_sent",
               "commit_confirmed", "reveal_sent")


@dataclass(frozen=True)
class ForcedWitness:
    """A witness pair a hook imposes instead of the replay's: what a faulty node journals."""

    value_hash: bytes
    proof_hash: bytes
    norm_bucket: int

    def __post_init__(self) -> None:
        if len(self.value_hash) != 32 or len(self.proof_hash) != 32:
            raise ValueError("a forced witness's value and proof hashes are 32 bytes each")
        if not -(2**31) < self.norm_bucket < 2**31:
            raise ValueError(f"a norm bucket is a signed 32-bit value above -2^31, got {self.norm_bucket}")


class NodeHooks:
    """The production daemon's hooks: every method steers nothing."""

    #: The fault's name, recorded with each witness it forced ("none": the daemon's own witness).
    fault: str = "none"

    def skips_work(self) -> bool:
        """True: the daemon moves a challenge from its opening straight to the witness, with no
        fetch and no replay (a lazy node)."""
        return False

    def witness(self, *, challenge_id: bytes, account: str, leaf_hash: bytes,
                declared_bucket: int | None) -> ForcedWitness | None:
        """A pair to journal instead of the daemon's own, or None (the daemon's own)."""
        return None

    def reached(self, point: str) -> None:
        """Called right after `point` (one of KILL_POINTS) became durable."""
        return None


__all__ = ["KILL_POINTS", "ForcedWitness", "NodeHooks"]
