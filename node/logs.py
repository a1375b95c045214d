"""Structured JSON logs: one object per line on stderr, with the fields a log shipper indexes.

`log_event(logger, "event_name", **fields)` puts the fields beside the message; exceptions come
out as a `exc` string so a line is always one valid JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _RESERVED and not k.startswith("_"):
                out[k] = v.hex() if isinstance(v, (bytes, bytearray)) else v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def setup_logging(level: str = "info", stream=None) -> None:
    """Route every logger to one JSON handler (replacing earlier handlers)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Library chatter (HTTP client, websockets) stays out of the node's stream unless it is bad news.
    for noisy in ("httpx", "httpcore", "websocket", "substrateinterface", "alembic", "numba"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_event(logger: logging.Logger, event: str, *, level: int = logging.INFO, exc_info: Any = None,
              **fields: Any) -> None:
    """Log `event` with `fields` as top-level JSON keys (bytes are written as hex); `exc_info` goes to
    the logger itself (as an `extra` key it would clash with the LogRecord attribute and raise)."""
    logger.log(level, event, exc_info=exc_info, extra={"event": event, **fields})
