"""Peak traced memory of one call, for the decoders' memory bounds."""

from __future__ import annotations

import tracemalloc

from challenges.opening import OpeningRefused
from commitments.errors import CommitmentError


def traced_peak(fn, *args) -> tuple[int, BaseException | None]:
    """Peak traced bytes while fn(*args) runs (its result dropped inside), and the refusal it
    raised (a CommitmentError or an OpeningRefused; anything else propagates)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        err = None
        try:
            out = fn(*args)
            del out
        except (CommitmentError, OpeningRefused) as exc:
            err = exc
        return tracemalloc.get_traced_memory()[1] - base, err
    finally:
        tracemalloc.stop()
