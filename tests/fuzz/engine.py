"""Run the atheris fuzz targets of tests/fuzz/targets, each in its own process, for a bounded time.

`python -m tests.fuzz.engine [TARGET ...] [--seconds N] [--artifacts DIR]` (what scripts/fuzz runs)
fuzzes each target from its seed corpus (tests/fuzz/corpus/<target>/) under libFuzzer limits on
total time, memory and time per input. A crash, a stall past the per-input timeout or a memory
blow-up is written as an input file under the artifacts folder (by default
tests/fuzz/regressions/<target>/, which tests/fuzz/test_fuzz_targets.py replays on every run).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
FUZZ_DIR = Path(__file__).resolve().parent
CORPUS = FUZZ_DIR / "corpus"
DICTS = FUZZ_DIR / "dicts"
REGRESSIONS = FUZZ_DIR / "regressions"
# Only the project's own code is instrumented for coverage: the libraries stay fast.
PACKAGES = ["commitments", "oracle", "challenges", "chain", "miner", "node"]
PER_INPUT_TIMEOUT_S = 10
RSS_LIMIT_MB = 3072
MAX_LEN = 64 * 1024
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_RUNS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


@dataclass
class Result:
    target: str
    returncode: int
    seconds: float
    runs: int = 0
    artifacts: list[Path] = field(default_factory=list)
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.artifacts

    def summary(self) -> str:
        if self.ok:
            return f"{self.target}: ok, {self.runs} inputs in {self.seconds:.0f} s"
        found = ", ".join(str(p) for p in self.artifacts) or "no input file written"
        return f"{self.target}: FAILED (exit {self.returncode}; {found})"


def fuzz_target(name: str, seconds: int, artifacts: Path, *, timeout_s: int = PER_INPUT_TIMEOUT_S,
                rss_limit_mb: int = RSS_LIMIT_MB, python: str = sys.executable) -> Result:
    """Fuzz one target for `seconds` in a child process; what it found lands in `artifacts`."""
    if name not in TARGETS:
        raise SystemExit(f"unknown fuzz target {name!r}; known: {', '.join(TARGETS)}")
    artifacts.mkdir(parents=True, exist_ok=True)
    seeds = CORPUS / name
    dictionary = DICTS / f"{name}.dict" if (DICTS / f"{name}.dict").exists() else DICTS / "cbor.dict"
    with tempfile.TemporaryDirectory(prefix=f"pot-fuzz-{name}-") as work:
        # New coverage goes to a scratch folder first; the committed seeds are read only.
        args = [
            python,
            "-m",
            "tests.fuzz.engine",
            "--child",
            name,
            work,
            *([str(seeds)] if seeds.is_dir() else []),
            f"-max_total_time={max(1, int(seconds))}",
            f"-timeout={timeout_s}",
            f"-rss_limit_mb={rss_limit_mb}",
            f"-max_len={MAX_LEN}",
            f"-artifact_prefix={artifacts}{os.sep}",
            f"-dict={dictionary}",
            "-print_final_stats=1",
        ]
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        )
        started = time.monotonic()
        # Room for start-up (imports, seeds) on top of the fuzzing time; past that it is a stall.
        try:
            # One stream, in order: atheris prints an uncaught exception's traceback on stdout and
            # libFuzzer its verdict on stderr, and the report's tail must hold both.
            proc = subprocess.run(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace", timeout=seconds + 120)
            code, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            text = b"".join(
                x if isinstance(x, bytes) else (x or "").encode() for x in (exc.stdout, exc.stderr)
            )
            code, out = (
                -1,
                text.decode(errors="replace") + f"\nthe fuzzer itself stalled past {seconds + 120} s",
            )
    runs = _RUNS.search(out)
    return Result(name, code, time.monotonic() - started, int(runs.group(1)) if runs else 0,
                  [Path(p) for p in _ARTIFACT.findall(out)], out[-4000:])


def _child(name: str, libfuzzer_args: list[str]) -> None:
    import logging

    import atheris

    from tests.fuzz import targets

    # The code under test logs every skipped input; at fuzzing rates that is only noise.
    logging.disable(logging.CRITICAL)
    with atheris.instrument_imports(include=PACKAGES):
        module = targets.load(name)
    atheris.Setup([sys.argv[0], *libfuzzer_args], module.TestOneInput)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="scripts/fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"default: all ({', '.join(TARGETS)})")
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time per target (default 60)")
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="where found inputs go (default tests/fuzz/regressions/<target>/)")
    parser.add_argument(
        "--timeout",
        type=int,
        default=PER_INPUT_TIMEOUT_S,
        help=f"seconds per input before it counts as a stall (default {PER_INPUT_TIMEOUT_S})",
    )
    parser.add_argument(
        "--rss-limit-mb",
        type=int,
        default=RSS_LIMIT_MB,
        help=f"memory of one target's process before it counts as a blow-up (default {RSS_LIMIT_MB})",
    )
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    if args.seconds < 1:
        parser.error("--seconds must be at least 1")
    failed = 0
    for name in args.targets or TARGETS:
        dest = args.artifacts / name if args.artifacts else REGRESSIONS / name
        result = fuzz_target(name, args.seconds, dest, timeout_s=args.timeout, rss_limit_mb=args.rss_limit_mb)
        print(result.summary(), flush=True)
        if not result.ok:
            failed += 1
            print(result.tail, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
