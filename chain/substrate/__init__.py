"""Substrate transports: protocol calls as `pot1` remarks on any chain, or a native PoT pallet.

One module per job: `client` (the one RPC choke point: timeout, retries, reconnect), `scale` (the
few codecs beside substrate-interface), `blocks` (decoding a finalized block and its events),
`base` (signing, the nonce floor, submission, inclusion), `remark` and `pallet` (the two ways of
carrying calls), `bonds` (the keyless bond account and the rule for a paid bond) and `connect`
(opening one from a URL and a key). Blocks are read by number from
the finalized head down a cursor, so a reconnect simply resumes where the caller was.
"""

from __future__ import annotations

from chain.substrate.base import DEFAULT_ERA_PERIOD, SubstrateTransport
from chain.substrate.bonds import BOND_ACCOUNT, PLANCK_PER_UNIT, bond_address
from chain.substrate.client import DEFAULT_RPC_TIMEOUT, RpcError, SubstrateClient
from chain.substrate.connect import connect_substrate
from chain.substrate.pallet import PalletConfig, PalletMissingError, PalletTransport
from chain.substrate.remark import RemarkTransport
from chain.transport import TransportError

__all__ = [
    "BOND_ACCOUNT",
    "DEFAULT_ERA_PERIOD",
    "DEFAULT_RPC_TIMEOUT",
    "PalletConfig",
    "PalletMissingError",
    "PalletTransport",
    "PLANCK_PER_UNIT",
    "RemarkTransport",
    "RpcError",
    "SubstrateClient",
    "SubstrateTransport",
    "TransportError",
    "bond_address",
    "connect_substrate",
]
