"""The daemon's scheduling policy, without threads or a database: the chain's block time as the node
sees it, each stage's wall-clock budget from the protocol windows, round-robin across miners with a
cap of jobs in flight per miner, and which stage errors are the input's fault.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Exceptions a parser raises on bytes it cannot make sense of: from an opening, a spec or a leaf
# list, they are the sender's fault and refuse the input. Anything else (AttributeError,
# AssertionError, OSError, MemoryError, ...) is taken for a bug or a local fault and retried.
UNTRUSTED_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, LookupError, OverflowError, RecursionError, EOFError, struct.error)
# Raised by the safetensors reader on a bad file; matched by name, so no import is needed here.
UNTRUSTED_INPUT_ERROR_NAMES = frozenset({"SafetensorError"})


def is_input_error(exc: BaseException) -> bool:
    """True if `exc` says the untrusted input is bad, not that this node is broken."""
    return isinstance(exc, UNTRUSTED_INPUT_ERRORS) or type(exc).__name__ in UNTRUSTED_INPUT_ERROR_NAMES


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """`Type: message`, cut short: a message may quote attacker-sized input."""
    try:
        text = str(exc)
    except Exception:  # a message that cannot be formatted (e.g. a huge int) still names its type
        text = "(message not printable)"
    return f"{type(exc).__name__}: {text[:limit]}"


class BlockClock:
    """Seconds per block, measured from the finalized head moving on (an exponential average).

    Catching up on old blocks does not count: only the head read from the chain is observed, so a
    node that ingests a thousand old blocks at once does not think blocks are instant.
    """

    def __init__(self, default_s: float, *, min_s: float = 0.05, max_s: float = 600.0,
                 alpha: float = 0.3) -> None:
        self.default_s = default_s
        self.min_s, self.max_s, self.alpha = min_s, max_s, alpha
        self._last: tuple[int, float] | None = None
        self._estimate: float | None = None

    def observe(self, head: int, now: float) -> None:
        if self._last is None or head < self._last[0]:
            self._last = (head, now)
            return
        last_head, last_at = self._last
        if head == last_head:
            return
        sample = (now - last_at) / (head - last_head)
        self._last = (head, now)
        self._estimate = sample if self._estimate is None else (
            self.alpha * sample + (1 - self.alpha) * self._estimate)

    @property
    def seconds_per_block(self) -> float:
        est = self.default_s if self._estimate is None else self._estimate
        return min(self.max_s, max(self.min_s, est))

    def seconds(self, blocks: float) -> float:
        return max(0.0, blocks) * self.seconds_per_block


@dataclass(frozen=True)
class Budgets:
    """Wall-clock budgets of the work stages, from the blocks left before the commit window closes.

    `margin_blocks` of the window are kept for the commit to be sent and included. The fetch may use
    `fetch_share` of what is left when it starts (the replay needs the rest); every stage is also
    capped by its own configured maximum.
    """

    margin_blocks: int
    fetch_share: float
    fetch_max_s: float
    validate_max_s: float
    losschecks_max_s: float
    replay_max_s: float

    def cap(self, stage: str) -> float:
        return {
            "fetch": self.fetch_max_s,
            "validate": self.validate_max_s,
            "losschecks": self.losschecks_max_s,
            "replay": self.replay_max_s,
        }[stage]

    def budget(self, stage: str, *, head: int, commit_deadline: int, clock: BlockClock) -> float:
        """Seconds `stage` may run if started now; 0 when too little of the window is left."""
        left = clock.seconds(commit_deadline - head - self.margin_blocks)
        if stage == "fetch":
            left *= self.fetch_share
        return min(self.cap(stage), left)

    def retry_delay(self, *, head: int, commit_deadline: int, clock: BlockClock, attempt: int, backoff,
                    min_s: float) -> float | None:
        """The wait before fetch retry `attempt` (0-based; `backoff`'s full-jitter delay), cut so
        that the retry still gets a fetch budget of `min_s`; None when even a retry started now
        would not: the failure then stands (the latest safe moment, with the commit margin kept)."""
        if self.budget("fetch", head=head, commit_deadline=commit_deadline, clock=clock) < min_s:
            return None
        left = clock.seconds(commit_deadline - head - self.margin_blocks)
        latest = left - min_s / self.fetch_share  # a later start leaves the fetch under min_s
        return max(0.0, min(backoff.delay(attempt), latest))

    @staticmethod
    def send_budget(*, head: int, deadline: int, clock: BlockClock, cap_s: float) -> float:
        """How long one commit or reveal submission may take: never past its window's last block."""
        return min(cap_s, clock.seconds(deadline - head))


def round_robin(
    items: Iterable[T], key: Callable[[T], Hashable], *, after: Hashable | None = None
) -> list[T]:
    """`items` interleaved by key: every key's first item, then every key's second, ...

    Keys are visited in sorted order, starting with the first key after `after` (the one served
    last), so no key is always first. Within a key the items keep their order (earliest deadline).
    """
    groups: dict[Any, list[T]] = {}
    for it in items:
        groups.setdefault(key(it), []).append(it)
    keys = sorted(groups, key=repr)
    if after is not None and keys:
        later = [k for k in keys if repr(k) > repr(after)]
        keys = later + [k for k in keys if repr(k) <= repr(after)]
    out: list[T] = []
    depth = 0
    while len(out) < sum(len(g) for g in groups.values()):
        out += [groups[k][depth] for k in keys if depth < len(groups[k])]
        depth += 1
    return out


class InFlight:
    """How many jobs each owner (a miner account, an endpoint host) has running, against a cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._count: dict[Hashable, int] = {}

    def admits(self, owners: Sequence[Hashable]) -> bool:
        return all(self._count.get(o, 0) < self.cap for o in owners)

    def add(self, owners: Sequence[Hashable]) -> None:
        for o in owners:
            self._count[o] = self._count.get(o, 0) + 1

    def remove(self, owners: Sequence[Hashable]) -> None:
        for o in owners:
            n = self._count.get(o, 0) - 1
            if n > 0:
                self._count[o] = n
            else:
                self._count.pop(o, None)

    def count(self, owner: Hashable) -> int:
        return self._count.get(owner, 0)


__all__ = ["BlockClock", "Budgets", "InFlight", "UNTRUSTED_INPUT_ERRORS", "describe_error", "is_input_error",
           "round_robin"]
