"""Open a Substrate transport: one client, one signing key, the remark or the pallet kind;
configuration mistakes are refused before any connection is made."""

from __future__ import annotations

from typing import Any

from chain.keys import load_key
from chain.substrate.client import SubstrateClient
from chain.substrate.pallet import PalletConfig, PalletTransport
from chain.substrate.remark import RemarkTransport
from chain.transport import Transport, TransportError

_CLIENT_OPTS = {"rpc_timeout", "max_attempts", "backoff_base", "backoff_max"}
_TRANSPORT_OPTS = {"era_period", "inclusion_poll"}


def connect_substrate(url: str, key_uri: str, kind: str = "remark", **opts: Any) -> Transport:
    """A remark or pallet transport to the node at `url`, signing with the key `key_uri`.

    Options: password (for a keystore), rpc_timeout, max_attempts, backoff_base, backoff_max,
    era_period, inclusion_poll; for kind="pallet" `pallet` (a PalletConfig or a mapping with
    pallet/calls/events). What a funded call pays (`planck_per_unit`) is no option: it is the
    network's parameter, read from the chain's record (chain.substrate.bonds).
    """
    password = opts.pop("password", None)
    pallet_cfg = opts.pop("pallet", None)
    if "planck_per_unit" in opts:
        raise TransportError(
            "planck_per_unit is no transport option: it is the network's protocol parameter "
            "(ProtocolParams.planck_per_unit, set by configure_network), read from the chain at each block"
        )
    unknown = set(opts) - _CLIENT_OPTS - _TRANSPORT_OPTS
    if unknown:
        raise TypeError(f"connect_substrate: unknown option(s) {', '.join(sorted(unknown))}")
    if kind not in ("remark", "pallet"):
        raise TransportError(f"unknown Substrate transport kind {kind!r}; use 'remark' or 'pallet'")
    if kind == "remark" and pallet_cfg is not None:
        raise TransportError("the 'pallet' option only applies to kind='pallet'")
    # Configuration mistakes are refused before any connection is made.
    config = PalletConfig.from_mapping(pallet_cfg) if kind == "pallet" else None
    client = SubstrateClient(url, **{k: v for k, v in opts.items() if k in _CLIENT_OPTS})
    try:
        client.ensure_connected()
        keypair = load_key(key_uri, password, ss58_format=client.ss58_format or 42)
        kw = {k: v for k, v in opts.items() if k in _TRANSPORT_OPTS}
        if config is None:
            return RemarkTransport(client, keypair, **kw)
        return PalletTransport(client, keypair, config=config, **kw)
    except BaseException:
        client.close()
        raise
