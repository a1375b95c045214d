"""What both Substrate transports share: reading finalized blocks, signing with a mortal era,
the nonce floor (so back-to-back sends never reuse a nonce), submission and inclusion tracking."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from scalecodec.utils.ss58 import ss58_encode
from substrateinterface import Keypair, SubstrateInterface

from chain.substrate.blocks import Executed, read_block
from chain.substrate.client import RpcError, SubstrateClient
from chain.substrate.scale import blake2_256, hex_bytes
from chain.transport import Receipt, Transport, TransportError

log = logging.getLogger(__name__)

DEFAULT_ERA_PERIOD = 64


class SubstrateTransport(Transport):
    """Reading finalized blocks, signing, nonces, submission and inclusion tracking: what both
    Substrate transports share. Subclasses say how calls are carried (`submit`, `block`)."""

    def __init__(
        self,
        client: SubstrateClient,
        keypair: Keypair,
        *,
        era_period: int = DEFAULT_ERA_PERIOD,
        inclusion_poll: float = 0.1,
    ) -> None:
        if keypair.crypto_type != 1:
            raise TransportError("Substrate transports sign with sr25519 keys only")
        if not 4 <= era_period <= 65536:
            raise TransportError(f"era_period must be in 4..65536 blocks, got {era_period}")
        self.client = client
        self._keypair = keypair
        self.era_period = era_period
        self.inclusion_poll = inclusion_poll
        self._submit_lock = threading.Lock()
        self._known_final = -1
        # The nonce after our last accepted submission, and the head it was sent at. A node may
        # answer system_accountNextIndex without counting its pool (chopsticks does while it builds
        # the previous block), so back-to-back sends would reuse a nonce and one would be dropped.
        # The floor expires with the era: by then a transaction that never landed is dead anyway.
        self._sent_next: int | None = None
        self._sent_head = 0
        client.ensure_connected()
        self._account = ss58_encode(keypair.public_key, client.ss58_format)

    @property
    def account(self) -> str:
        return self._account

    def close(self) -> None:
        self.client.close()

    # --- reading ----------------------------------------------------------------------------

    def finalized_head(self) -> int:
        h = self.client.rpc("chain_getFinalizedHead", [])
        header = self.client.rpc("chain_getHeader", [h])
        try:
            number = int(header["number"], 16)
        except (TypeError, KeyError, ValueError):
            raise TransportError(f"chain_getHeader({h!r}) answered no usable header") from None
        self._known_final = number
        return number

    def _finalized_hash(self, number: int) -> str:
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise TransportError(f"block number must be an integer >= 0, got {number!r}")
        # Finality only moves forward, so a block at or below a head already seen needs no query.
        if number > self._known_final:
            head = self.finalized_head()
            if number > head:
                raise TransportError(f"block {number} is not finalized yet (finalized head is {head})")
        h = self.client.rpc("chain_getBlockHash", [number])
        if not h:
            raise TransportError(f"the node has no block {number}")
        return h

    def _read_block(self, number: int) -> tuple[str, list[Any], dict[int, Executed], float | None]:
        """(hash, decoded extrinsics or None per undecodable one, per-extrinsic outcome, timestamp)."""
        block_hash = self._finalized_hash(number)
        decoded, outcome, timestamp = read_block(self.client, block_hash, number)
        return block_hash, decoded, outcome, timestamp

    # --- submission ---------------------------------------------------------------------------

    def _chain_next_nonce(self) -> int:
        value = self.client.rpc("system_accountNextIndex", [self._account])
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TransportError(f"system_accountNextIndex answered {value!r}, not a nonce")
        return value

    def _submit_composed(
        self, compose: Callable[[SubstrateInterface], Any], *, wait: bool, timeout: float
    ) -> Receipt:
        """Sign and send one extrinsic (fresh nonce, mortal era), then optionally await finality."""
        deadline = time.monotonic() + timeout
        with self._submit_lock:
            # The node's next index is the truth once our sends are in its pool or on chain; the
            # sent floor covers the gap before that, and `floor` steps past a nonce another sender
            # holds for one submission.
            floor = 0
            for attempt in range(1, 6):
                head = self.finalized_head()
                sent = (
                    self._sent_next
                    if self._sent_next is not None and head <= self._sent_head + self.era_period
                    else 0
                )
                nonce = max(self._chain_next_nonce(), sent, floor)

                def build(si: SubstrateInterface, nonce=nonce, head=head):
                    call = compose(si)
                    ext = si.create_signed_extrinsic(
                        call=call,
                        keypair=self._keypair,
                        era={"period": self.era_period, "current": head},
                        nonce=nonce,
                    )
                    return "0x" + bytes(ext.data.data).hex()

                ext_hex = self.client.call("sign extrinsic", build)
                tx_hash = blake2_256(hex_bytes(ext_hex))
                try:
                    # Not retried blindly: after a dropped connection we look before resending.
                    self.client.rpc("author_submitExtrinsic", [ext_hex], retry=False)
                except RpcError as exc:
                    text = f"{exc.code} {exc.message}".lower()
                    if "already imported" in text or exc.code == 1013:
                        pass
                    elif "stale" in text or "outdated" in text:
                        log.info("nonce %d is stale; refreshing it (attempt %d)", nonce, attempt)
                        floor = 0
                        self._sent_next = None
                        continue
                    elif "priority is too low" in text or exc.code == 1014:
                        log.info("nonce %d is taken in the pool; using the next one", nonce)
                        floor = nonce + 1
                        continue
                    else:
                        raise TransportError(f"the node rejected the extrinsic: {exc.message}") from None
                except TransportError as exc:
                    log.warning("submitting the extrinsic failed (%s); checking whether it arrived", exc)
                    time.sleep(self.client.backoff(attempt))
                    try:
                        arrived = self._chain_next_nonce() > nonce
                    except TransportError:
                        arrived = False
                    if not arrived:
                        if time.monotonic() > deadline:
                            raise
                        continue
                self._sent_next, self._sent_head = nonce + 1, head
                receipt = Receipt(tx_hash=tx_hash)
                if not wait:
                    return receipt
                return self._await_inclusion(
                    tx_hash, after=head, era_end=head + self.era_period, deadline=deadline
                )
        raise TransportError("could not find a usable nonce after 5 attempts")

    def _await_inclusion(self, tx_hash: bytes, *, after: int, era_end: int, deadline: float) -> Receipt:
        checked = after
        while True:
            head = self.finalized_head()
            while checked < head:
                checked += 1
                block_hash = self._finalized_hash(checked)
                body = self.client.rpc("chain_getBlock", [block_hash]) or {}
                exts = (body.get("block") or {}).get("extrinsics") or []
                for idx, hexdata in enumerate(exts):
                    if blake2_256(hex_bytes(hexdata)) != tx_hash:
                        continue
                    _, _, outcome, _ = self._read_block(checked)
                    ex = outcome.get(idx, Executed())
                    if not ex.success:
                        raise TransportError(
                            f"extrinsic 0x{tx_hash.hex()} failed in block {checked}: {ex.failure}"
                        )
                    return Receipt(tx_hash=tx_hash, block_number=checked, block_hash=hex_bytes(block_hash))
            if checked > era_end:
                raise TransportError(
                    f"extrinsic 0x{tx_hash.hex()} was not included before its era ended (block {era_end})"
                )
            if time.monotonic() > deadline:
                raise TransportError(
                    f"extrinsic 0x{tx_hash.hex()} not in a finalized block yet (checked up to {checked})"
                )
            time.sleep(self.inclusion_poll)
