"""The gates of ./scripts/test fail on a planted fault: a type error, coverage under the floor, a
warning, a long line. Each plants its fault in a temporary project that takes the repository's own
settings (pyproject.toml, scripts/test), runs the real tool on it, and checks the tool's verdict
both ways: the fault fails, the same project without it passes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _run(args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _types_project(tmp_path: Path, strict_body: str, basic_body: str) -> Path:
    """A project with the repository's type-checker settings: `strict_pkg` is checked strictly (as
    commitments is), `basic_pkg` in basic mode (as node is)."""
    bp = CONFIG["tool"]["basedpyright"]
    assert bp["typeCheckingMode"] == "basic" and "commitments" in bp["strict"]
    settings = {k: v for k, v in bp.items() if k not in ("include", "exclude", "strict", "venvPath", "venv")}
    lines = ["[tool.basedpyright]", 'include = ["strict_pkg", "basic_pkg"]', 'strict = ["strict_pkg"]']
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]  # strings, booleans: TOML as JSON
    _write(tmp_path / "pyproject.toml", "\n".join(lines) + "\n")
    _write(tmp_path / "strict_pkg" / "__init__.py", strict_body)
    _write(tmp_path / "basic_pkg" / "__init__.py", basic_body)
    return tmp_path


CLEAN_STRICT = """
    def total(xs: list[int]) -> int:
        return sum(xs)
"""
CLEAN_BASIC = """
    def name(x):
        return str(x)
"""


@pytest.mark.slow
def test_the_type_checker_fails_on_a_planted_type_error_and_strictness_follows_the_package(tmp_path):
    checker = str(BIN / "basedpyright")
    ok = _run([checker], _types_project(tmp_path / "ok", CLEAN_STRICT, CLEAN_BASIC))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # A wrong type fails anywhere.
    bad = _run([checker], _types_project(tmp_path / "bad", CLEAN_STRICT, 'x: int = "seven"\n'))
    assert bad.returncode == 1 and "reportAssignmentType" in bad.stdout, bad.stdout
    # An unannotated parameter is allowed in basic mode (CLEAN_BASIC) and fails in a strict package.
    loose = _run([checker], _types_project(tmp_path / "loose", CLEAN_BASIC, CLEAN_BASIC))
    assert loose.returncode == 1 and "strict_pkg" in loose.stdout and "basic_pkg" not in loose.stdout
    assert "reportMissingParameterType" in loose.stdout, loose.stdout


def _floor() -> int:
    m = re.search(r"^COVERAGE_FLOOR=(\d+)$", (ROOT / "scripts" / "test").read_text(), re.M)
    assert m, "scripts/test sets COVERAGE_FLOOR"
    return int(m.group(1))


def test_coverage_under_the_floor_fails_the_report_scripts_test_runs(tmp_path):
    floor = _floor()
    assert 0 < floor <= 100
    # A module of which a test runs 3 of its 5 statements (the two defs and one return).
    _write(tmp_path / "half.py", """
        def used():
            return 1

        def unused():
            a = 1
            return a
    """)
    _write(tmp_path / "test_half.py", """
        import half

        def test_used():
            assert half.used() == 1
    """)
    env = {"COVERAGE_FILE": str(tmp_path / ".coverage")}
    run = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                "-c", os.devnull, "--cov=half", "--cov-report=", "test_half.py"], tmp_path, **env)
    assert run.returncode == 0, run.stdout + run.stderr
    report = [str(BIN / "coverage"), "report", "--format=total"]
    below = _run([*report, f"--fail-under={floor}"], tmp_path, **env)
    assert below.returncode == 2 and below.stdout.splitlines()[0] == "60", below.stdout + below.stderr
    assert f"less than fail-under={floor}" in below.stdout
    above = _run([*report, "--fail-under=50"], tmp_path, **env)
    assert above.returncode == 0, above.stdout + above.stderr


def test_a_warning_fails_the_test_that_raised_it_and_a_leaked_socket_does_not(tmp_path):
    # The repository's pytest settings (filterwarnings among them), on a project of three tests.
    filters = CONFIG["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert filters[0] == "error"
    ini = "[pytest]\nfilterwarnings =\n" + "".join(f"    {f}\n" for f in filters)
    (tmp_path / "pytest.ini").write_text(ini)
    _write(tmp_path / "test_w.py", """
        import socket
        import warnings

        def test_deprecated():
            warnings.warn("old API", DeprecationWarning)

        def test_user_warning():
            warnings.warn("suspicious", UserWarning)

        def test_leaked_socket():
            s = socket.socket()
            del s  # dropped unclosed: a ResourceWarning, reported but not failed

        def test_quiet():
            assert True
    """)
    run = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                "test_w.py"], tmp_path)
    out = run.stdout
    assert run.returncode == 1, out
    assert "FAILED test_w.py::test_deprecated" in out and "FAILED test_w.py::test_user_warning" in out
    assert "2 failed, 2 passed" in out, out


def test_a_line_over_110_characters_fails_ruff(tmp_path):
    assert CONFIG["tool"]["ruff"]["line-length"] == 110
    assert "E501" not in CONFIG["tool"]["ruff"]["lint"]["ignore"]
    fits = "x = " + repr("a" * (110 - 6)) + "\n"
    assert len(fits) == 111  # 110 characters and the newline
    _write(tmp_path / "fits.py", fits)
    _write(tmp_path / "long.py", "x = " + repr("a" * (111 - 6)) + "\n")
    cmd = [str(BIN / "ruff"), "check", "--no-cache", "--config", str(ROOT / "pyproject.toml")]
    assert _run([*cmd, "fits.py"], tmp_path).returncode == 0
    long = _run([*cmd, "long.py"], tmp_path)
    assert long.returncode == 1 and "E501" in long.stdout, long.stdout
