"""The atheris fuzz targets (tests/fuzz/targets/) as tests.

Always on and fast: every seed of tests/fuzz/corpus/ and every regression input of
tests/fuzz/regressions/ (crashes found by fuzzing, and the attacks of the hostile-input issue)
goes through its target in-process, with a per-input time limit, so a stall is a failure.
Marked `fuzz` (skip with -m "not fuzz"): a short coverage-guided run of every target, about
60 s in all, each target in its own process under libFuzzer's time and memory limits.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.fuzz.engine import CORPUS, REGRESSIONS, fuzz_target
from tests.fuzz.targets import TARGETS, load

REPLAY_TIMEOUT_S = 5
FUZZ_SECONDS_IN_ALL = 48  # fuzzing proper; with the start-ups the test takes about a minute


class Stalled(BaseException):
    """Raised by the alarm: a BaseException, so no target's refusal handling can swallow it."""


def _replay(target: str, path: Path) -> None:
    module = load(target)
    data = path.read_bytes()

    def alarm(signum, frame):
        raise Stalled(f"{target}/{path.name} took more than {REPLAY_TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, REPLAY_TIMEOUT_S)
    try:
        module.TestOneInput(data)
    except Stalled as exc:
        pytest.fail(str(exc))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _inputs(root: Path) -> list[tuple[str, Path]]:
    return [
        (t, p) for t in TARGETS if (root / t).is_dir() for p in sorted((root / t).iterdir()) if p.is_file()
    ]


def test_every_target_has_seeds():
    assert {t for t, _ in _inputs(CORPUS)} == set(TARGETS)
    total = sum(p.stat().st_size for _, p in _inputs(CORPUS) + _inputs(REGRESSIONS))
    assert total < 1024 * 1024, f"the seeds and regression inputs hold {total} bytes: keep them small"


@pytest.mark.parametrize(
    ("target", "path"), _inputs(CORPUS), ids=lambda v: v.name if isinstance(v, Path) else v
)
def test_seed(target, path):
    _replay(target, path)


# Regression inputs whose fix is not in this tree yet, with the reason: strict, so the mark must
# go as soon as the fix lands.
PENDING: dict[tuple[str, str], str] = {}


def _regressions() -> list:
    out = []
    for target, path in _inputs(REGRESSIONS):
        reason = PENDING.get((target, path.name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(target, path, marks=marks, id=f"{target}/{path.name}"))
    return out


@pytest.mark.parametrize(("target", "path"), _regressions())
def test_regression(target, path):
    _replay(target, path)


def test_the_honest_opening_passes_validation():
    # The opening targets only prove something if their base opening is accepted in full.
    from tests.fuzz.targets import _opening

    data, _ = _opening.base()
    _opening.check(data)
    assert (CORPUS / "opening_file" / "valid-step2").read_bytes() == data


def test_the_dev_seed_resolves_its_challenge_honestly():
    from chain.protocol.events import ChallengeIssued, ChallengeResolved, VerifierPenalized
    from tests.fuzz.targets import dev_block

    view = dev_block.apply((CORPUS / "dev_block" / "honest-run").read_bytes())
    assert [e.verdict for e in view.of(ChallengeResolved)] == ["honest"]
    # The verifiers bonded before the draw, so the committee is theirs and every member revealed.
    assert [e.committee for e in view.of(ChallengeIssued)] == [("v1", "v2", "v3")]
    assert view.of(VerifierPenalized) == []


@pytest.mark.fuzz
def test_short_fuzz_run(tmp_path):
    """Every target fuzzed for its share of about a minute; any input it finds fails the test."""
    seconds = max(2, FUZZ_SECONDS_IN_ALL // len(TARGETS))
    results = [fuzz_target(t, seconds, tmp_path / t) for t in TARGETS]
    failed = [r for r in results if not r.ok]
    report = "\n".join(r.summary() for r in results)
    assert not failed, (f"{report}\n\nKeep each input under tests/fuzz/regressions/<target>/ and fix the "
                        f"decoder; first failure:\n{failed[0].tail}")
