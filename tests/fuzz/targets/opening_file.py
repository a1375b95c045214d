"""challenges.opening.load_opening on a file written from arbitrary bytes, then validate_opening
against the honest opening's chain facts: only OpeningRefused, and only the honest bytes pass."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.fuzz.targets import _opening

_DIR = tempfile.mkdtemp(prefix="pot-fuzz-opening-")
_PATH = Path(_DIR) / "opening.bin"
_opening.base()


def TestOneInput(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        _opening.check(data, path=_PATH)
    finally:
        os.unlink(_PATH)


def seeds() -> dict[str, bytes]:
    from challenges.opening import MAGIC

    data = _opening.build()
    return {"valid-step2": data, "header-only": MAGIC + b"\0\0\0\1" + b"\xa0"}
