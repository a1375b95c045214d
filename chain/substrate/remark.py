"""The substrate-remark transport: protocol calls as `pot1` payloads in
`System.remark_with_event`, on any Substrate chain; a remark counts only if its `Remarked` event
shows it executed."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from scalecodec.utils.ss58 import ss58_encode
from substrateinterface import SubstrateInterface

from chain.calls import CallDecodeError, CallError, Ignored, decode_call, encode_call, read_payload
from chain.substrate.base import SubstrateTransport
from chain.substrate.blocks import Executed
from chain.substrate.scale import blake2_256, hex_bytes, pubkey
from chain.transport import Block, Receipt, TransportError

log = logging.getLogger(__name__)


class RemarkTransport(SubstrateTransport):
    """Protocol calls as `pot1` payloads in `System.remark_with_event` on any Substrate chain."""

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        if not calls:
            raise TransportError("submit needs at least one call")
        payloads = []
        for i, call in enumerate(calls):
            try:
                payloads.append(encode_call(call))
            except CallError as exc:
                raise TransportError(f"call {i} cannot be encoded: {exc}") from None
        return self.submit_remarks(payloads, wait=wait, timeout=timeout)

    def submit_payloads(self, payloads: list[bytes], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit already-encoded calls byte for byte (journal re-sends), refusing non-calls."""
        payloads = [bytes(p) for p in payloads]
        for i, p in enumerate(payloads):
            try:
                decode_call(p)
            except CallDecodeError as exc:
                raise TransportError(f"payload {i} is not a protocol call: {exc}") from None
        return self.submit_remarks(payloads, wait=wait, timeout=timeout)

    def submit_remarks(
        self, payloads: Iterable[bytes], *, wait: bool = True, timeout: float = 60.0
    ) -> Receipt:
        """Put raw remark payloads on chain in one extrinsic (one remark, or Utility.batch_all)."""
        payloads = [bytes(p) for p in payloads]
        if not payloads:
            raise TransportError("submit needs at least one remark")

        def compose(si: SubstrateInterface):
            remarks = [si.compose_call("System", "remark_with_event", {"remark": p}) for p in payloads]
            if len(remarks) == 1:
                return remarks[0]
            return si.compose_call("Utility", "batch_all", {"calls": remarks})

        return self._submit_composed(compose, wait=wait, timeout=timeout)

    def block(self, number: int) -> Block:
        block_hash, decoded, outcome, timestamp = self._read_block(number)
        calls: list[tuple[str, Any]] = []
        ignored: list[Ignored] = []
        position = [0]  # executed remarks seen so far in this block, foreign ones included
        for idx, ext in enumerate(decoded):
            if not ext or "address" not in ext:
                continue  # inherents and undecodable extrinsics carry no protocol calls
            where = f"block {number} extrinsic {idx}"
            try:
                self._extrinsic(ext, outcome.get(idx, Executed()), where, calls, ignored, position)
            except Exception as exc:  # one odd extrinsic must not hide the others or stop the block
                log.warning("%s: skipped: reading it failed (%s)", where, type(exc).__name__)
        return Block(number=number, hash=hex_bytes(block_hash), calls=tuple(calls), timestamp=timestamp,
                     ignored=tuple(ignored))

    def _extrinsic(self, ext: Mapping[str, Any], ex: Executed, where: str, calls: list[tuple[str, Any]],
                   ignored: list[Ignored], position: list[int]) -> None:
        remarks = list(_walk_remarks(ext.get("call") or {}, where))
        if not remarks:
            return
        if not ex.success:
            log.info("%s: skipped %d remark(s): the extrinsic failed (%s)", where, len(remarks), ex.failure)
            return
        try:
            signer = pubkey(ext["address"])
        except ValueError as exc:
            log.warning("%s: skipped: signer address unusable (%s)", where, exc)
            return
        origin = ss58_encode(signer, self.client.ss58_format)
        # The Remarked events are the executed remarks, in order; a remark inside an
        # interrupted Utility.batch has none and is left out.
        pending = list(ex.remarks)
        for payload in remarks:
            digest = blake2_256(payload)
            hit = next((i for i, (who, h) in enumerate(pending) if h == digest and who == signer), None)
            if hit is None:
                log.info("%s: skipped a remark that did not execute", where)
                continue
            del pending[: hit + 1]
            at = position[0]
            position[0] += 1
            got = read_payload(payload)
            if got is None:
                log.info("%s: skipped foreign remark (%d bytes, not pot1)", where, len(payload))
            elif isinstance(got, CallDecodeError):
                log.warning("%s: malformed pot1 remark from %s (%s): %s", where, origin, got.reason, got)
                ignored.append(Ignored.of_error(at, origin, payload, got))
            else:
                calls.append((origin, got))


def _walk_remarks(call: Mapping[str, Any], where: str) -> Iterable[bytes]:
    """Remark payloads of a call tree in execution order (remark_with_event, inside batches)."""
    module, function = call.get("module"), call.get("function")
    if module == "System" and function == "remark_with_event":
        yield call["remark"]
    elif module == "System" and function == "remark":
        log.info("%s: skipped System.remark (protocol calls travel in remark_with_event)", where)
    for inner in call.get("inner") or ():
        yield from _walk_remarks(inner, where)
