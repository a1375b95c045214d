"""The `pot` entry point: every noun is mounted, and `pot --help` stays light (no torch import)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_noun_is_mounted_and_help_does_not_import_torch():
    code = ("import sys; from typer.testing import CliRunner; from pot.cli import SUBAPPS, app; "
            "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
            "missing = [n for n, *_ in SUBAPPS if n not in r.output]; assert not missing, missing; "
            "assert 'torch' not in sys.modules, 'pot --help imported torch'; print(len(SUBAPPS))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) >= 11
