"""Retries, the one policy every network and polling loop uses: capped exponential backoff with
full jitter (a delay drawn uniformly from [0, min(cap, base * 2^attempt)]), so that many clients
that failed together do not retry together."""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """base_s: the first window; cap_s: the largest window. attempt counts from 0."""

    base_s: float = 0.5
    cap_s: float = 15.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and self.cap_s > 0):
            raise ValueError(f"backoff: base_s and cap_s must be > 0, got {self.base_s}, {self.cap_s}")

    def window(self, attempt: int) -> float:
        """The upper end of the delay before retry `attempt` (0-based)."""
        return min(self.cap_s, self.base_s * 2.0 ** min(max(attempt, 0), 60))

    def delay(self, attempt: int) -> float:
        """A full-jitter delay before retry `attempt` (0-based)."""
        return self.rng.uniform(0.0, self.window(attempt))

    def sleep(self, attempt: int) -> float:
        d = self.delay(attempt)
        time.sleep(d)
        return d


def call_with_retries(fn: Callable[[], T], *, attempts: int, backoff: Backoff,
                      retry_on: tuple[type[BaseException], ...] = (Exception,),
                      sleep: Callable[[float], object] = time.sleep) -> T:
    """Call `fn` up to `attempts` times, sleeping backoff.delay(i) after failure i; the last
    failure propagates."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for i in range(attempts):
        try:
            return fn()
        except retry_on:
            if i == attempts - 1:
                raise
            sleep(backoff.delay(i))
    raise AssertionError("unreachable")
