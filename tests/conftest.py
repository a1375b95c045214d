"""Hypothesis on CI (CI set in the environment, as .ci/run's caller sets it): derandomized, one
fixed sequence of examples per test, so a run on main is reproducible and a failure reruns the same
way. Elsewhere each run draws new examples and keeps exploring."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
