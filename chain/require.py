"""Only `pot chain dev` and `pot demo` create chains: every other command that is given a dev
chain URL refuses one whose file does not exist, saying which command would create it, instead of
quietly starting a new chain of its own (whose database a later start on the real chain refuses)."""

from __future__ import annotations

from pathlib import Path

from chain.connect import ChainURLError, parse_dev_url


class NoChain(ChainURLError):
    """A dev chain URL whose file does not exist."""


def require_chain(url: str) -> None:
    """Refuse a dev:// URL whose chain file is missing; other URLs pass (their node answers)."""
    if not isinstance(url, str) or not url.startswith("dev:"):
        return
    path, _ = parse_dev_url(url)
    p = Path(path)
    if not p.is_file():
        raise NoChain(
            f"no dev chain at {p} (from {url}): this command never creates a chain. Create it first with "
            f"`pot chain dev --db {p} --interval 1` (it seals a block a second until stopped; add "
            f"--params FILE to record protocol parameters), or point the URL at an existing chain")


__all__ = ["NoChain", "require_chain"]
