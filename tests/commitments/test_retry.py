"""The one retry policy: capped exponential windows, full jitter, bounded attempts."""
import random

import pytest

from commitments.retry import Backoff, call_with_retries


def test_windows_double_then_cap():
    b = Backoff(base_s=0.5, cap_s=4.0)
    assert [b.window(i) for i in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.window(10**6) == 4.0


def test_full_jitter_spans_the_window():
    b = Backoff(base_s=1.0, cap_s=8.0, rng=random.Random(7))
    ds = [b.delay(3) for _ in range(2000)]
    assert all(0.0 <= d <= 8.0 for d in ds)
    assert min(ds) < 0.5 and max(ds) > 7.5  # full jitter, not "half" jitter around the window


def test_bad_parameters_refused():
    with pytest.raises(ValueError, match="base_s"):
        Backoff(base_s=0, cap_s=1)


def test_call_with_retries_sleeps_between_failures():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("down")
        return "ok"

    assert call_with_retries(flaky, attempts=5, backoff=Backoff(0.1, 1.0), sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2 and all(0 <= s <= 0.2 for s in sleeps)
    with pytest.raises(OSError):
        call_with_retries(
            lambda: (_ for _ in ()).throw(OSError("x")),
            attempts=2,
            backoff=Backoff(0.01, 0.01),
            sleep=sleeps.append,
        )
