"""The shape of a test network: what the one protocol suite needs from any transport.

A Network gives a Transport per account ("miner", "v1".."v4"), makes finalized blocks on demand,
and builds a ChainView that derives the protocol state from those blocks. `DevNetwork` runs over
a dev-chain file; the chopsticks network (tests/chain/chopsticks_env.py) runs over a real runtime.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chain.protocol import ProtocolParams
    from chain.transport import Receipt, Transport
    from chain.view import ChainView

ACCOUNTS = ("miner", "v1", "v2", "v3", "v4")


class Network(abc.ABC):
    """One chain and its accounts, as the protocol suite sees it."""

    params: ProtocolParams

    @abc.abstractmethod
    def transport(self, name: str) -> Transport:
        """The transport that signs as account `name` (one of ACCOUNTS)."""

    @abc.abstractmethod
    def advance(self, n: int = 1) -> int:
        """Make `n` more finalized blocks (empty unless calls are pending); return the new head."""

    def view(self) -> ChainView:
        """A ChainView over this chain, caught up with the finalized head."""
        from chain.view import ChainView

        v = ChainView(self.transport(ACCOUNTS[0]), self.params)
        v.sync()
        return v

    def submit(self, account: str, *calls: Any) -> Receipt:
        """Submit calls as `account` and wait until a finalized block includes them."""
        return self.transport(account).submit(list(calls), wait=True)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop whatever the network started."""
