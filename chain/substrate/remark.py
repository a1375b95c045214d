"""The substrate-remark transport: protocol calls as `pot1` payloads in
`System.remark_with_event`, on any Substrate chain; a remark counts only if its `Remarked` event
shows it executed, and a `bond_verifier` remark only if its extrinsic also paid the bond
(chain.substrate.bonds: a transfer into the keyless bond account, checked from the events)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from scalecodec.utils.ss58 import ss58_encode
from substrateinterface import Keypair, SubstrateInterface

from chain.calls import (
    BondVerifier,
    CallDecodeError,
    CallError,
    Ignored,
    decode_call,
    encode_call,
    read_payload,
)
from chain.substrate.base import SubstrateTransport
from chain.substrate.blocks import Executed
from chain.substrate.bonds import (
    BOND_ACCOUNT,
    PLANCK_PER_UNIT,
    TRANSFER_CALLS,
    BondError,
    bond_address,
    bond_planck,
    check_planck_per_unit,
    funding_shortfall,
)
from chain.substrate.client import SubstrateClient
from chain.substrate.scale import blake2_256, hex_bytes, pubkey
from chain.transport import Block, Receipt, TransportError

log = logging.getLogger(__name__)


class RemarkTransport(SubstrateTransport):
    """Protocol calls as `pot1` payloads in `System.remark_with_event` on any Substrate chain.

    Bonds: `submit` (and `submit_payloads`) with `BondVerifier` calls among its calls pays for
    them in the same extrinsic: one `Balances.transfer_keep_alive` (or `transfer_allow_death`, or
    `transfer`, whichever the runtime has) of the bonds' sum x `planck_per_unit` planck into the
    keyless bond account, first, then the remarks, all in one `Utility.batch_all` (so the bond
    and its payment land together or not at all). `UnbondVerifier` needs nothing special: it is
    a plain remark, and nothing is ever transferred back, since no one can sign for the keyless
    account (the protocol releases the bond in its own accounting). See chain.substrate.bonds.
    """

    def __init__(
        self, client: SubstrateClient, keypair: Keypair, *, planck_per_unit: int = PLANCK_PER_UNIT, **kw: Any
    ) -> None:
        try:
            self.planck_per_unit = check_planck_per_unit(planck_per_unit)
        except BondError as exc:
            raise TransportError(str(exc)) from None
        super().__init__(client, keypair, **kw)

    @property
    def bond_account(self) -> str:
        """The SS58 address of the keyless account bonds are paid into, on this chain."""
        return bond_address(self.client.ss58_format)

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit calls as remarks in one extrinsic, paying for any `BondVerifier` among them."""
        if not calls:
            raise TransportError("submit needs at least one call")
        payloads = []
        for i, call in enumerate(calls):
            try:
                payloads.append(encode_call(call))
            except CallError as exc:
                raise TransportError(f"call {i} cannot be encoded: {exc}") from None
        return self._send(payloads, [c.amount for c in calls if isinstance(c, BondVerifier)], wait, timeout)

    def submit_payloads(self, payloads: list[bytes], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit already-encoded calls byte for byte (journal re-sends), refusing non-calls; a
        `bond_verifier` payload is paid for as in `submit`, so a re-sent bond counts too."""
        payloads = [bytes(p) for p in payloads]
        bonds = []
        for i, p in enumerate(payloads):
            try:
                call = decode_call(p)
            except CallDecodeError as exc:
                raise TransportError(f"payload {i} is not a protocol call: {exc}") from None
            if isinstance(call, BondVerifier):
                bonds.append(call.amount)
        return self._send(payloads, bonds, wait, timeout)

    def submit_remarks(
        self, payloads: Iterable[bytes], *, wait: bool = True, timeout: float = 60.0
    ) -> Receipt:
        """Put raw remark payloads on chain in one extrinsic (one remark, or Utility.batch_all).

        Nothing is added: a `bond_verifier` payload sent this way carries no payment, and every
        node records it as ignored with reason "unfunded_bond".
        """
        return self._send([bytes(p) for p in payloads], [], wait, timeout)

    def _send(self, payloads: list[bytes], bonds: list[int], wait: bool, timeout: float) -> Receipt:
        if not payloads:
            raise TransportError("submit needs at least one remark")
        try:
            planck = bond_planck(bonds, self.planck_per_unit)
        except BondError as exc:
            raise TransportError(f"cannot pay for the bond(s): {exc}") from None
        dest = "0x" + BOND_ACCOUNT.hex()

        def compose(si: SubstrateInterface):
            calls = [si.compose_call("System", "remark_with_event", {"remark": p}) for p in payloads]
            if planck:
                calls.insert(0, si.compose_call("Balances", _transfer_call(si), {"dest": dest, "value": planck}))
            if len(calls) == 1:
                return calls[0]
            return si.compose_call("Utility", "batch_all", {"calls": calls})

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
                read_extrinsic(ext, outcome.get(idx, Executed()), where, calls, ignored, position,
                               ss58_format=self.client.ss58_format, planck_per_unit=self.planck_per_unit)
            except Exception as exc:  # one odd extrinsic must not hide the others or stop the block
                log.warning("%s: skipped: reading it failed (%s)", where, type(exc).__name__)
        return Block(number=number, hash=hex_bytes(block_hash), calls=tuple(calls), timestamp=timestamp,
                     ignored=tuple(ignored))


def _transfer_call(si: SubstrateInterface) -> str:
    """The first of TRANSFER_CALLS the runtime's Balances pallet has."""
    pallet = next((p for p in si.metadata.pallets if p.name == "Balances"), None)
    if pallet is None:
        raise TransportError("cannot pay for a bond: the runtime has no Balances pallet")
    have = {c.name for c in (pallet.calls or [])}
    for name in TRANSFER_CALLS:
        if name in have:
            return name
    raise TransportError(
        f"cannot pay for a bond: the runtime's Balances pallet has none of {', '.join(TRANSFER_CALLS)}"
    )


def read_extrinsic(ext: Mapping[str, Any], ex: Executed, where: str, calls: list[tuple[str, Any]],
                   ignored: list[Ignored], position: list[int], *, ss58_format: int | None,
                   planck_per_unit: int = PLANCK_PER_UNIT) -> None:
    """Append the protocol calls and ignored records of one decoded extrinsic `ext`, whose events
    say `ex`, to `calls` and `ignored`; `position` counts the block's executed remarks so far.

    Nothing is appended until the whole extrinsic is read: whether its bond calls count depends
    on all of them (chain.substrate.bonds).
    """
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
    origin = ss58_encode(signer, 42 if ss58_format is None else ss58_format)
    # The Remarked events are the executed remarks, in order; a remark inside an
    # interrupted Utility.batch has none and is left out.
    pending = list(ex.remarks)
    executed: list[tuple[int, bytes, Any]] = []
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
        else:
            executed.append((at, payload, got))
    bonds = [got.amount for _, _, got in executed if isinstance(got, BondVerifier)]
    shortfall = (
        funding_shortfall(signer, ex.transfers, bonds, planck_per_unit=planck_per_unit, ss58_format=ss58_format)
        if bonds else None
    )
    for at, payload, got in executed:
        if isinstance(got, CallDecodeError):
            log.warning("%s: malformed pot1 remark from %s (%s): %s", where, origin, got.reason, got)
            ignored.append(Ignored.of_error(at, origin, payload, got))
        elif shortfall is not None and isinstance(got, BondVerifier):
            log.warning("%s: unfunded bond_verifier from %s: %s", where, origin, shortfall)
            ignored.append(Ignored.of(at, origin, payload, "unfunded_bond", shortfall))
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
