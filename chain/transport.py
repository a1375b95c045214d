"""The one interface every chain transport implements (dev, substrate-remark, substrate-pallet).

A transport moves protocol calls onto a chain and brings finalized blocks back. It never decides
anything: every node derives the protocol state by applying the calls of finalized blocks, in
order, with `chain.protocol.apply` (the same code behind every transport).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chain.calls import CallDecodeError, Ignored, decode_call

if TYPE_CHECKING:  # annotations only: the protocol is a reader of transports, not their dependency
    from chain.protocol.params import ProtocolParams
    from chain.protocol.state import ProtocolState


@dataclass(frozen=True)
class Block:
    """A finalized block as the protocol sees it."""

    number: int
    hash: bytes  # 32 bytes; its BLAKE3 with run data is the challenge randomness
    # (origin account id as text, call object) in the order the chain executed them.
    calls: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    timestamp: float | None = None
    # Payloads with our prefix that were not calls; the protocol records each as RemarkIgnored.
    ignored: tuple[Ignored, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Receipt:
    """What a submission returned: the block that included it (if known yet) and the tx hash."""

    tx_hash: bytes
    block_number: int | None = None
    block_hash: bytes | None = None


class TransportError(RuntimeError):
    """A transport-level failure (connection, timeout, rejected extrinsic), with a reason."""


class Transport(abc.ABC):
    """Submit calls, follow finalized blocks from a cursor, name the account.

    These methods are the whole interface: callers use nothing else, and never probe a transport
    with getattr. A new transport implements the four abstract ones and overrides the others
    where it has something better than the default.
    """

    @property
    @abc.abstractmethod
    def account(self) -> str:
        """The account id (text) that signs this transport's submissions."""

    @abc.abstractmethod
    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit one or more protocol calls in one transaction (batched where supported)."""

    @abc.abstractmethod
    def finalized_head(self) -> int:
        """Number of the newest finalized block."""

    @abc.abstractmethod
    def block(self, number: int) -> Block:
        """The finalized block `number`, with its protocol calls decoded; a payload with our prefix
        that is not a call goes to `Block.ignored`, and no payload stops the others being read."""

    def settle(self, block: Block, state: ProtocolState) -> Block:
        """`block` as the protocol applies it under `state`, after the block's own protocol work
        (so `state.params` are the parameters in force at it): a chain view calls this before it
        applies a block's calls. A transport whose calls count only under a parameter decides
        them here (the substrate-remark transport's paid calls, whose price is the network's
        `planck_per_unit`); the default has none and returns the block as it is."""
        return block

    def submit_payloads(self, payloads: list[bytes], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit calls already encoded with `encode_call` (e.g. bytes replayed from a journal).

        The same bytes give the same calls on chain, so re-sending after a crash is idempotent at
        the protocol level. Transports that carry raw payloads override this to skip the decode.
        """
        try:
            calls = [decode_call(p) for p in payloads]
        except CallDecodeError as exc:
            raise TransportError(f"cannot submit the payload: {exc}") from None
        return self.submit(calls, wait=wait, timeout=timeout)

    def follow(self, cursor: int, *, poll: float = 0.5,
               stop: Callable[[], bool] | None = None) -> Iterator[Block]:
        """Yield finalized blocks after `cursor`, in order, forever (or until `stop()` is true)."""
        nxt = cursor + 1
        while stop is None or not stop():
            head = self.finalized_head()
            while nxt <= head:
                yield self.block(nxt)
                nxt += 1
                if stop is not None and stop():
                    return
            time.sleep(poll)

    def protocol_params(self) -> ProtocolParams | None:
        """The protocol parameters the chain itself records from genesis, or None.

        A dev chain file records them (`pot chain dev --params`); Substrate chains do not. On every
        chain the network's `configure_network` records are the rulebook from their blocks on;
        `chain.network.read_network` reads both.
        """
        return None

    def network_authority(self) -> str | None:
        """The account the chain itself names as the network's authority (the only origin whose
        configure_network records count), or None where the chain names none.

        A dev chain file names the account that created it; Substrate chains name none, so their
        participants pin one (`[chain] authority`, `--authority`).
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
