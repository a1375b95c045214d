"""A flat TOML writer for the files a local network hands its processes (node configs, secrets,
protocol parameters, specs): top-level keys, then one level of tables. Python reads TOML
(tomllib) but does not write it, and these files need nothing more."""

from __future__ import annotations

import json
from typing import Any


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def to_toml(doc: dict[str, Any]) -> str:
    """`doc` as TOML: its non-table keys first, then each dict value as a [table] of plain keys."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"
