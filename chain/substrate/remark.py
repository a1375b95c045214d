"""The substrate-remark transport: protocol calls as `pot1` payloads in
`System.remark_with_event`, on any Substrate chain; a remark counts only if its `Remarked` event
shows it executed, and a funded call (`bond_verifier`, `start_training_commitment`) only if its
extrinsic also paid for it (chain.substrate.bonds: a transfer into the keyless bond account,
checked from the events under the parameters in force at the block, `RemarkTransport.settle`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scalecodec.utils.ss58 import ss58_encode
from substrateinterface import Keypair, SubstrateInterface

from chain.calls import (
    CallDecodeError,
    CallError,
    Ignored,
    decode_call,
    encode_call,
    read_payload,
)
from chain.network import read_network
from chain.protocol.params import ProtocolParams
from chain.substrate.base import SubstrateTransport
from chain.substrate.blocks import Executed
from chain.substrate.bonds import (
    BOND_ACCOUNT,
    FUNDED_CALLS,
    TRANSFER_CALLS,
    BondError,
    Transfer,
    bond_address,
    bond_planck,
    funded_label,
    funded_units,
    funding_shortfall,
)
from chain.substrate.client import SubstrateClient
from chain.substrate.scale import blake2_256, hex_bytes, pubkey
from chain.transport import Block, Receipt, TransportError

if TYPE_CHECKING:
    from chain.protocol.state import ProtocolState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Paid:
    """What one extrinsic paid: its signer and the (from, to, planck) of its Balances.Transfer
    events. Shared by the funded remarks of that extrinsic (the rule sums them)."""

    extrinsic: int
    signer: bytes
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class Remark:
    """One executed `pot1` remark of a block: its position, sender, bytes, what it decoded to (a
    call or a CallDecodeError), and for a funded call the payment of its extrinsic (else None)."""

    position: int
    origin: str
    payload: bytes
    got: Any
    paid: Paid | None = None


@dataclass(frozen=True)
class RemarkBlock(Block):
    """A block read by the remark transport before `settle`: `calls` and `ignored` hold what
    counts whatever the parameters, `remarks` every executed pot1 remark in order, the funded
    calls included (which count only once `settle` has checked their payment)."""

    remarks: tuple[Remark, ...] = field(default_factory=tuple)
    ss58_format: int | None = None

    @property
    def funded(self) -> bool:
        return any(r.paid is not None for r in self.remarks)


class RemarkTransport(SubstrateTransport):
    """Protocol calls as `pot1` payloads in `System.remark_with_event` on any Substrate chain.

    Funded calls: `submit` (and `submit_payloads`) with `BondVerifier` or `StartTrainingCommitment`
    calls among its calls pays for them in the same extrinsic: one `Balances.transfer_keep_alive`
    (or `transfer_allow_death`, or `transfer`, whichever the runtime has) of what they carry x
    `planck_per_unit` planck into the keyless bond account, first, then the remarks, all in one
    `Utility.batch_all` (so the calls and their payment land together or not at all). The amount
    is computed under the network's parameters (`submit_params`), and an account that cannot pay
    it is refused before anything is sent. `UnbondVerifier` needs nothing special: it is a plain
    remark, and nothing is ever transferred back, since no one can sign for the keyless account
    (the protocol releases bonds, stakes and escrow in its own accounting). See chain.substrate.bonds.

    Reading: `block` leaves the funded calls undecided (`RemarkBlock`); `settle(block, state)`,
    which a chain view calls with its state once the block's protocol work is done, checks their
    payment under `state.params`, the parameters in force at the block.
    """

    def __init__(self, client: SubstrateClient, keypair: Keypair, **kw: Any) -> None:
        super().__init__(client, keypair, **kw)
        # (block, params, schedule) of the last state this transport settled a block with: what
        # the submitting side pays under while it is recent (`submit_params`).
        self._seen: tuple[int, ProtocolParams, tuple[tuple[int, dict], ...]] | None = None

    @property
    def bond_account(self) -> str:
        """The SS58 address of the keyless account funded calls are paid into, on this chain."""
        return bond_address(self.client.ss58_format)

    # --- submitting -------------------------------------------------------------------------

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit calls as remarks in one extrinsic, paying for the funded calls among them."""
        if not calls:
            raise TransportError("submit needs at least one call")
        payloads = []
        for i, call in enumerate(calls):
            try:
                payloads.append(encode_call(call))
            except CallError as exc:
                raise TransportError(f"call {i} cannot be encoded: {exc}") from None
        return self._send(payloads, [c for c in calls if type(c) in FUNDED_CALLS], wait, timeout)

    def submit_payloads(self, payloads: list[bytes], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit already-encoded calls byte for byte (journal re-sends), refusing non-calls; a
        funded payload is paid for as in `submit`, so a re-sent bond counts too (and a re-sent
        registration pays again, for nothing: the protocol keeps the run's first)."""
        payloads = [bytes(p) for p in payloads]
        funded = []
        for i, p in enumerate(payloads):
            try:
                call = decode_call(p)
            except CallDecodeError as exc:
                raise TransportError(f"payload {i} is not a protocol call: {exc}") from None
            if type(call) in FUNDED_CALLS:
                funded.append(call)
        return self._send(payloads, funded, wait, timeout)

    def submit_remarks(
        self, payloads: Iterable[bytes], *, wait: bool = True, timeout: float = 60.0
    ) -> Receipt:
        """Put raw remark payloads on chain in one extrinsic (one remark, or Utility.batch_all).

        Nothing is added: a `bond_verifier` or `start_training_commitment` payload sent this way
        carries no payment, and every node records it as ignored ("unfunded_bond", "unfunded_run").
        """
        return self._send([bytes(p) for p in payloads], [], wait, timeout)

    def submit_params(self) -> list[ProtocolParams]:
        """The parameters a transaction sent now may be checked under: those in force at the
        finalized head, then each scheduled change that takes effect before the transaction's era
        ends. They come from the state this transport last settled a block with, when that block
        is within an era of the head (a follower on this transport); otherwise from the chain's
        configure_network records, read afresh (chain.network.read_network; the default record
        when there is none)."""
        head = self.finalized_head()
        seen = self._seen
        if seen is not None and seen[0] + self.era_period >= head:
            params, schedule = seen[1], seen[2]
        else:
            log.info("reading the network's parameters up to block %d to size a payment", head)
            rec = read_network(self, head)
            params = rec.current or ProtocolParams()
            schedule = tuple((int(eff), d) for eff, _, d in rec.state.schedule)
        last = head + self.era_period + 1
        return [params, *(ProtocolParams.from_dict(d) for eff, d in schedule if eff <= last)]

    def _funding(self, funded: list[Any]) -> tuple[int, str]:
        """(planck, what they pay for) of the funded calls `funded`: the most any parameters in
        `submit_params` need, so the calls count wherever in the era the transaction lands."""
        best, what = 0, ""
        for params in self.submit_params():
            units = [funded_units(c, params) or 0 for c in funded]
            try:
                planck = bond_planck(units, params.planck_per_unit)
            except BondError as exc:
                raise TransportError(f"cannot pay for {', '.join(funded_label(c, params) for c in funded)}: "
                                     f"{exc}") from None
            if planck > best or not what:
                best = planck
                what = (f"{', '.join(funded_label(c, params) for c in funded)}: {sum(units)} units x "
                        f"{params.planck_per_unit} planck")
        return best, what

    def _check_balance(self, planck: int, what: str) -> None:
        """Refuse, before sending, a payment the signer's free balance cannot make and keep the
        existential deposit (a keep-alive transfer would fail, and the whole batch with it)."""
        def read(si: SubstrateInterface) -> tuple[int, int]:
            info = si.query("System", "Account", [self.account])
            ed = si.get_constant("Balances", "ExistentialDeposit")
            return int(info.value["data"]["free"]), int(ed.value) if ed is not None else 0

        free, ed = self.client.call("read the signer's balance", read)
        if free < planck + ed:
            raise TransportError(
                f"cannot pay for {what}: that is {planck} planck into the bond account {self.bond_account}, "
                f"and {self.account} holds {free} free planck (it must keep the existential deposit, {ed}, "
                f"and the fee); {planck + ed - free} planck short")

    def _send(self, payloads: list[bytes], funded: list[Any], wait: bool, timeout: float) -> Receipt:
        if not payloads:
            raise TransportError("submit needs at least one remark")
        planck = 0
        if funded:
            planck, what = self._funding(funded)
            if planck:
                self._check_balance(planck, what)
        dest = "0x" + BOND_ACCOUNT.hex()

        def compose(si: SubstrateInterface):
            calls = [si.compose_call("System", "remark_with_event", {"remark": p}) for p in payloads]
            if planck:
                calls.insert(
                    0, si.compose_call("Balances", _transfer_call(si), {"dest": dest, "value": planck})
                )
            if len(calls) == 1:
                return calls[0]
            return si.compose_call("Utility", "batch_all", {"calls": calls})

        return self._submit_composed(compose, wait=wait, timeout=timeout)

    # --- reading ----------------------------------------------------------------------------

    def block(self, number: int) -> RemarkBlock:
        """The finalized block `number`, its funded calls not yet decided (see `settle`)."""
        block_hash, decoded, outcome, timestamp = self._read_block(number)
        remarks: list[Remark] = []
        position = [0]  # executed remarks seen so far in this block, foreign ones included
        for idx, ext in enumerate(decoded):
            if not ext or "address" not in ext:
                continue  # inherents and undecodable extrinsics carry no protocol calls
            where = f"block {number} extrinsic {idx}"
            try:
                remarks += read_extrinsic(ext, outcome.get(idx, Executed()), where, position,
                                          ss58_format=self.client.ss58_format, extrinsic=idx)
            except Exception as exc:  # one odd extrinsic must not hide the others or stop the block
                log.warning("%s: skipped: reading it failed (%s)", where, type(exc).__name__)
        calls, ignored = assemble(remarks, None, self.client.ss58_format, number)
        return RemarkBlock(
            number=number,
            hash=hex_bytes(block_hash),
            calls=tuple(calls),
            timestamp=timestamp,
            ignored=tuple(ignored),
            remarks=tuple(remarks),
            ss58_format=self.client.ss58_format,
        )

    def settle(self, block: Block, state: ProtocolState) -> Block:
        """`block` with its funded calls decided under `state.params` (the parameters in force at
        the block, once its protocol work is done): each counts if its extrinsic paid for it, else
        it is ignored. Remembers the state's parameters and schedule for `submit_params`."""
        self._seen = (block.number, state.params, tuple((int(eff), d) for eff, _, d in state.schedule))
        if not isinstance(block, RemarkBlock) or not block.funded:
            return block
        calls, ignored = assemble(list(block.remarks), state.params, block.ss58_format, block.number)
        return Block(number=block.number, hash=block.hash, calls=tuple(calls), timestamp=block.timestamp,
                     ignored=tuple(ignored))


def _transfer_call(si: SubstrateInterface) -> str:
    """The first of TRANSFER_CALLS the runtime's Balances pallet has."""
    pallet = next((p for p in si.metadata.pallets if p.name == "Balances"), None)
    if pallet is None:
        raise TransportError("cannot pay for a funded call: the runtime has no Balances pallet")
    have = {c.name for c in (pallet.calls or [])}
    for name in TRANSFER_CALLS:
        if name in have:
            return name
    raise TransportError(
        f"cannot pay for a funded call: the runtime's Balances pallet has none of {', '.join(TRANSFER_CALLS)}"
    )


def read_extrinsic(ext: Mapping[str, Any], ex: Executed, where: str, position: list[int], *,
                   ss58_format: int | None, extrinsic: int = 0) -> list[Remark]:
    """The executed pot1 remarks of one decoded extrinsic `ext`, whose events say `ex`, in order;
    `position` counts the block's executed remarks so far. A funded call carries the payment of
    its extrinsic (`Paid`), to be checked by `assemble` under the parameters of the block."""
    remarks = list(_walk_remarks(ext.get("call") or {}, where))
    if not remarks:
        return []
    if not ex.success:
        log.info("%s: skipped %d remark(s): the extrinsic failed (%s)", where, len(remarks), ex.failure)
        return []
    try:
        signer = pubkey(ext["address"])
    except ValueError as exc:
        log.warning("%s: skipped: signer address unusable (%s)", where, exc)
        return []
    origin = ss58_encode(signer, 42 if ss58_format is None else ss58_format)
    paid = Paid(extrinsic, signer, tuple(ex.transfers))
    # The Remarked events are the executed remarks, in order; a remark inside an
    # interrupted Utility.batch has none and is left out.
    pending = list(ex.remarks)
    out: list[Remark] = []
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
            out.append(Remark(at, origin, payload, got))
        else:
            out.append(Remark(at, origin, payload, got, paid if type(got) in FUNDED_CALLS else None))
    return out


def assemble(remarks: list[Remark], params: ProtocolParams | None, ss58_format: int | None,
             number: int = 0) -> tuple[list[tuple[str, Any]], list[Ignored]]:
    """(calls, ignored) of the executed pot1 remarks of block `number`, in order. With `params`,
    the funded calls of each extrinsic count if its transfers into the bond account pay for all of
    them (chain.substrate.bonds), else each is ignored with its reason; without, they are left out."""
    shortfall: dict[int, str | None] = {}
    fault: set[int] = set()
    if params is not None:
        groups: dict[int, list[Remark]] = {}
        for r in remarks:
            if r.paid is not None:
                groups.setdefault(r.paid.extrinsic, []).append(r)
        for idx, group in groups.items():
            try:
                shortfall[idx] = _shortfall(group, params, ss58_format)
            except Exception as exc:  # never a stopped block: every node records the same fault
                log.warning("block %d extrinsic %d: checking its payment failed (%s)", number, idx,
                            type(exc).__name__)
                fault.add(idx)
    calls: list[tuple[str, Any]] = []
    ignored: list[Ignored] = []
    for r in remarks:
        if isinstance(r.got, CallDecodeError):
            ignored.append(Ignored.of_error(r.position, r.origin, r.payload, r.got))
        elif r.paid is None:
            calls.append((r.origin, r.got))
        elif params is None:
            continue
        elif r.paid.extrinsic in fault:
            ignored.append(Ignored.of(r.position, r.origin, r.payload, "transport_fault"))
        elif (detail := shortfall[r.paid.extrinsic]) is not None:
            reason = FUNDED_CALLS[type(r.got)]
            log.warning("block %d extrinsic %d: %s %s from %s: %s", number, r.paid.extrinsic, reason,
                        r.got.NAME, r.origin, detail)
            ignored.append(Ignored.of(r.position, r.origin, r.payload, reason, detail))
        else:
            calls.append((r.origin, r.got))
    return calls, ignored


def _shortfall(group: list[Remark], params: ProtocolParams, ss58_format: int | None) -> str | None:
    """The funding rule for the funded remarks of one extrinsic (all paid together or none)."""
    needs = [(r, funded_units(r.got, params)) for r in group]
    needs = [(r, u) for r, u in needs if u is not None]
    if not needs:
        return None
    paid = group[0].paid
    assert paid is not None
    return funding_shortfall(paid.signer, paid.transfers, [u for _, u in needs],
                             planck_per_unit=params.planck_per_unit, ss58_format=ss58_format,
                             labels=[funded_label(r.got, params) for r, _ in needs])


def _walk_remarks(call: Mapping[str, Any], where: str) -> Iterable[bytes]:
    """Remark payloads of a call tree in execution order (remark_with_event, inside batches)."""
    module, function = call.get("module"), call.get("function")
    if module == "System" and function == "remark_with_event":
        yield call["remark"]
    elif module == "System" and function == "remark":
        log.info("%s: skipped System.remark (protocol calls travel in remark_with_event)", where)
    for inner in call.get("inner") or ():
        yield from _walk_remarks(inner, where)
