"""The shape of a test network: what the one protocol suite needs from any transport.

A Network gives a Transport per account ("miner", "v1".."v5"), makes finalized blocks on demand,
and builds a ChainView that derives the protocol state from those blocks. `DevNetwork` runs over
a dev-chain file; the chopsticks network (tests/chain/chopsticks_env.py) runs over a real runtime.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chain.protocol import ProtocolParams
    from chain.transport import Receipt, Transport
    from chain.view import ChainView

ACCOUNTS = ("miner", "v1", "v2", "v3", "v4", "v5")


class Network(abc.ABC):
    """One chain and its accounts, as the protocol suite sees it."""

    params: ProtocolParams
    # The block a fresh view starts after (a chain that existed before the test has history).
    start_block: int = 0

    @abc.abstractmethod
    def transport(self, name: str) -> Transport:
        """The transport that signs as account `name` (one of ACCOUNTS)."""

    @abc.abstractmethod
    def advance(self, n: int = 1) -> int:
        """Make `n` more finalized blocks (empty unless calls are pending); return the new head."""

    def view(self) -> ChainView:
        """A ChainView over this chain, caught up with the finalized head."""
        from chain.view import ChainView

        v = ChainView(self.transport(ACCOUNTS[0]), self.params, cursor=self.start_block)
        v.sync()
        return v

    def submit(self, account: str, *calls: Any) -> Receipt:
        """Submit calls as `account` and wait until a finalized block includes them."""
        return self.transport(account).submit(list(calls), wait=True)

    def account(self, name: str) -> str:
        """The chain's account id of `name` (the origin its calls carry)."""
        return self.transport(name).account

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop whatever the network started."""


class DevNetwork(Network):
    """A dev-chain file with instant sealing: every submission is its own finalized block."""

    def __init__(self, params: ProtocolParams, path: str | Path) -> None:
        from chain.dev import DevTransport

        self.params = params
        self.path = Path(path)
        self._transports = {name: DevTransport(self.path, name, sealing="instant") for name in ACCOUNTS}

    def transport(self, name: str) -> Transport:
        try:
            return self._transports[name]
        except KeyError:
            raise KeyError(f"no account {name!r}; accounts are {', '.join(ACCOUNTS)}") from None

    def advance(self, n: int = 1) -> int:
        t = self._transports[ACCOUNTS[0]]
        for _ in range(n):
            t.seal()
        return t.finalized_head()

    def close(self) -> None:
        for t in self._transports.values():
            t.close()
        self._transports.clear()
