"""Open a Substrate transport: one client, one signing key, the remark or the pallet kind;
configuration mistakes are refused before any connection is made."""

from __future__ import annotations

from typing import Any

from chain.keys import load_key
from chain.substrate.bonds import BondError, check_planck_per_unit
from chain.substrate.client import SubstrateClient
from chain.substrate.pallet import PalletConfig, PalletTransport
from chain.substrate.remark import RemarkTransport
from chain.transport import Transport, TransportError

_CLIENT_OPTS = {"rpc_timeout", "max_attempts", "backoff_base", "backoff_max"}
_TRANSPORT_OPTS = {"era_period", "inclusion_poll"}


def connect_substrate(url: str, key_uri: str, kind: str = "remark", **opts: Any) -> Transport:
    """A remark or pallet transport to the node at `url`, signing with the key `key_uri`.

    Options: password (for a keystore), rpc_timeout, max_attempts, backoff_base, backoff_max,
    era_period, inclusion_poll; for kind="remark" `planck_per_unit` (planck per protocol unit of
    a bond, default chain.substrate.bonds.PLANCK_PER_UNIT = 10**10; the same on every node of a
    network); for kind="pallet" `pallet` (a PalletConfig or a mapping with pallet/calls/events).
    """
    password = opts.pop("password", None)
    pallet_cfg = opts.pop("pallet", None)
    planck_per_unit = opts.pop("planck_per_unit", None)
    unknown = set(opts) - _CLIENT_OPTS - _TRANSPORT_OPTS
    if unknown:
        raise TypeError(f"connect_substrate: unknown option(s) {', '.join(sorted(unknown))}")
    if kind not in ("remark", "pallet"):
        raise TransportError(f"unknown Substrate transport kind {kind!r}; use 'remark' or 'pallet'")
    if kind == "remark" and pallet_cfg is not None:
        raise TransportError("the 'pallet' option only applies to kind='pallet'")
    if kind == "pallet" and planck_per_unit is not None:
        raise TransportError(
            "the 'planck_per_unit' option only applies to kind='remark' (the pallet transport does not bond)"
        )
    remark_kw: dict[str, Any] = {}
    if planck_per_unit is not None:
        try:
            remark_kw["planck_per_unit"] = check_planck_per_unit(planck_per_unit)
        except BondError as exc:
            raise TransportError(str(exc)) from None
    # Configuration mistakes are refused before any connection is made.
    config = PalletConfig.from_mapping(pallet_cfg) if kind == "pallet" else None
    client = SubstrateClient(url, **{k: v for k, v in opts.items() if k in _CLIENT_OPTS})
    try:
        client.ensure_connected()
        keypair = load_key(key_uri, password, ss58_format=client.ss58_format or 42)
        kw = {k: v for k, v in opts.items() if k in _TRANSPORT_OPTS}
        if config is None:
            return RemarkTransport(client, keypair, **kw, **remark_kw)
        return PalletTransport(client, keypair, config=config, **kw)
    except BaseException:
        client.close()
        raise
