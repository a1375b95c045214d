"""Open a transport from a chain URL: `dev:///path/to/file.db` or `ws://host:port` (wss too).

Substrate support is imported only when a ws URL is used, so dev-only tools never load
substrate-interface.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from chain.transport import Transport, TransportError

DEV_DEFAULT_ACCOUNT = "alice"


class ChainURLError(TransportError):
    """A chain URL this node cannot use, with the accepted forms."""


def parse_dev_url(url: str) -> tuple[str, dict[str, str]]:
    """(file path, query options) of a dev URL: dev:///abs/file.db, dev://rel/file.db[?sealing=...]."""
    parts = urlsplit(url)
    path = parts.netloc + parts.path
    if parts.scheme != "dev" or not path:
        raise ChainURLError(f"{url!r}: a dev chain URL looks like dev:///path/to/chain.db")
    opts = {k: v[-1] for k, v in parse_qs(parts.query, strict_parsing=False).items()}
    unknown = set(opts) - {"sealing"}
    if unknown:
        raise ChainURLError(
            f"{url!r}: unknown dev URL option(s) {', '.join(sorted(unknown))} (known: sealing)"
        )
    return path, opts


def connect(url: str, *, account: str | None = None, key: str | None = None, **opts: Any) -> Transport:
    """A transport for `url`.

    dev: `account` names the signer (default "alice"); `sealing` ("instant"/"interval") may come
    from the URL query or opts. ws/wss: `key` is the signer's key URI, mnemonic or keystore
    (falls back to `account`), `kind` is "remark" (default) or "pallet"; other opts go to the
    substrate transport.
    """
    if not isinstance(url, str):
        raise ChainURLError(f"chain URL must be text, got {type(url).__name__}")
    scheme = urlsplit(url).scheme
    if scheme == "dev":
        from chain.dev import DevTransport

        opts.pop("kind", None)  # one option set serves every URL; dev has a single kind
        path, query = parse_dev_url(url)
        sealing = opts.pop("sealing", None) or query.get("sealing")
        return DevTransport(path, account or DEV_DEFAULT_ACCOUNT, sealing=sealing, **opts)
    if scheme in ("ws", "wss"):
        kind = opts.pop("kind", "remark")
        if kind not in ("remark", "pallet"):
            raise ChainURLError(f"substrate transport kind must be 'remark' or 'pallet', got {kind!r}")
        from chain.substrate import connect_substrate

        return connect_substrate(url, key if key is not None else account, kind=kind, **opts)
    raise ChainURLError(f"{url!r}: unsupported chain URL; use dev:///path/to/chain.db or ws://host:port")
