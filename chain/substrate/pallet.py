"""The substrate-pallet transport: protocol calls as calls of a native PoT pallet, checked against
the runtime's metadata (pallet, call argument names, events) before use.

Bonding is refused here. A bond on a Substrate chain must be paid in chain value that every node
can check (chain.substrate.bonds); a native pallet would take the payment itself (reserve or
transfer the amount inside its `bond_verifier` dispatch), and no runtime with such a pallet exists
for this project to define and test that against. So `submit` refuses `BondVerifier` with a
TransportError, and a `bond_verifier` pallet call read from a block is recorded as ignored with
reason "unfunded_bond", never passed to the protocol. Bond on the remark transport instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scalecodec.utils.ss58 import ss58_encode
from substrateinterface import Keypair, SubstrateInterface

from chain.calls import CALL_TYPES, BondVerifier, Call, CallError, Ignored
from chain.substrate.base import SubstrateTransport
from chain.substrate.blocks import Executed
from chain.substrate.client import SubstrateClient
from chain.substrate.scale import hex_bytes, pubkey
from chain.transport import Block, Receipt, TransportError

log = logging.getLogger(__name__)


# Protocol calls a PoT pallet may lack: a runtime that keeps the network's parameters in its own
# storage has no configure_network, and its participants pin the parameters instead; this
# transport does not bond (see the module docstring), so the bonding calls are optional too.
OPTIONAL_CALLS = frozenset({"configure_network", "bond_verifier", "unbond_verifier"})

PALLET_BOND_REFUSAL = (
    "the pallet transport cannot bond: a bond must be paid in chain value every node can check, "
    "which needs a PoT pallet that takes the payment in its bond_verifier call, and no such runtime "
    "exists to define and check it against; bond with the substrate-remark transport (kind='remark'), "
    "which pays into the keyless bond account in the same extrinsic"
)
PALLET_BOND_IGNORED = "a bond_verifier pallet call: the pallet transport cannot check a bond's payment"


class PalletMissingError(TransportError):
    """The connected runtime lacks the PoT pallet, or a call or event the configuration names."""


@dataclass(frozen=True)
class PalletConfig:
    """Names of the PoT pallet, its calls (by protocol call name) and its events, as on chain."""

    pallet: str = "ProofOfTraining"
    calls: Mapping[str, str] = field(default_factory=lambda: {name: name for name in CALL_TYPES})
    events: tuple[str, ...] = ("ChallengeIssued", "ChallengeResolved", "MinerSlashed")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | PalletConfig | None) -> PalletConfig:
        if data is None:
            return cls()
        if isinstance(data, PalletConfig):
            return data
        unknown = set(data) - {"pallet", "calls", "events"}
        if unknown:
            raise TransportError(f"pallet configuration: unknown key(s) {', '.join(sorted(unknown))}")
        base = cls()
        calls = dict(base.calls)
        calls.update(data.get("calls") or {})
        bad = set(calls) - set(CALL_TYPES)
        if bad:
            raise TransportError(
                f"pallet configuration names unknown protocol call(s): {', '.join(sorted(bad))}"
            )
        return cls(
            pallet=str(data.get("pallet", base.pallet)),
            calls=calls,
            events=tuple(data.get("events", base.events)),
        )


class PalletTransport(SubstrateTransport):
    """Protocol calls as calls of a native PoT pallet; refuses runtimes that lack it."""

    def __init__(
        self, client: SubstrateClient, keypair: Keypair, *, config: PalletConfig | None = None, **kw
    ):
        self.config = config or PalletConfig()
        self._checked_version: Any = None
        super().__init__(client, keypair, **kw)
        self.check_runtime()

    def check_runtime(self) -> None:
        """Compare the configured pallet, calls (with their argument names) and events with metadata."""

        def run(si: SubstrateInterface):
            si.init_runtime()
            pallets = {p.name: p for p in si.metadata.pallets}
            return si.runtime_version, si.chain, pallets

        version, chain_name, pallets = self.client.call("read metadata", run)
        if version == self._checked_version:
            return
        cfg = self.config
        pallet = pallets.get(cfg.pallet)
        if pallet is None:
            raise PalletMissingError(
                f"the runtime of {chain_name!r} at {self.client.url} (spec version {version}) has no pallet "
                f"{cfg.pallet!r}; it has {', '.join(sorted(pallets))}. Use the substrate-remark transport "
                f"(kind='remark', calls as pot1 remarks) on chains without a native PoT pallet."
            )
        calls = {c.name: c for c in (pallet.calls or [])}
        for proto_name, chain_name_ in cfg.calls.items():
            call = calls.get(chain_name_)
            if call is None and proto_name in OPTIONAL_CALLS:
                continue
            if call is None:
                raise PalletMissingError(
                    f"pallet {cfg.pallet!r} has no call {chain_name_!r} (for {proto_name}); "
                    f"it has {', '.join(sorted(calls)) or 'no calls'}"
                )
            have = [a.name for a in call.args]
            want = list(CALL_TYPES[proto_name].FIELDS)
            if have != want:
                raise PalletMissingError(
                    f"{cfg.pallet}.{chain_name_} takes ({', '.join(have)}), the protocol call {proto_name} "
                    f"has ({', '.join(want)})"
                )
        events = {e.name for e in (pallet.events or [])}
        missing = [e for e in cfg.events if e not in events]
        if missing:
            raise PalletMissingError(f"pallet {cfg.pallet!r} lacks event(s) {', '.join(missing)}")
        self._checked_version = version

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        if not calls:
            raise TransportError("submit needs at least one call")
        for i, call in enumerate(calls):
            if not isinstance(call, Call) or type(call).NAME not in CALL_TYPES:
                raise TransportError(f"call {i} is not a protocol call: {type(call).__name__}")
            if isinstance(call, BondVerifier):
                raise TransportError(f"call {i}: {PALLET_BOND_REFUSAL}")
        self.check_runtime()
        cfg = self.config

        def compose(si: SubstrateInterface):
            composed = [si.compose_call(cfg.pallet, cfg.calls[c.NAME], _pallet_args(c)) for c in calls]
            if len(composed) == 1:
                return composed[0]
            return si.compose_call("Utility", "batch_all", {"calls": composed})

        return self._submit_composed(compose, wait=wait, timeout=timeout)

    def block(self, number: int) -> Block:
        block_hash, decoded, outcome, timestamp = self._read_block(number)
        by_chain_name = {v: k for k, v in self.config.calls.items()}
        calls: list[tuple[str, Any]] = []
        ignored: list[Ignored] = []
        position = 0  # executed pallet calls seen so far in this block
        for idx, ext in enumerate(decoded):
            if not ext or "address" not in ext:
                continue
            where = f"block {number} extrinsic {idx}"
            try:
                found = list(_walk_pallet(ext.get("call") or {}, self.config.pallet, batch=False))
            except Exception as exc:  # one odd call tree must not stop the block
                log.warning("%s: skipped: reading its calls failed (%s)", where, type(exc).__name__)
                continue
            if not found:
                continue
            ex = outcome.get(idx, Executed())
            if not ex.success:
                log.info("%s: skipped %d pallet call(s): the extrinsic failed", where, len(found))
                continue
            try:
                origin = ss58_encode(pubkey(ext["address"]), self.client.ss58_format)
            except ValueError as exc:
                log.warning("%s: skipped: signer address unusable (%s)", where, exc)
                continue
            for pcall, in_batch in found:
                if in_batch and ex.batch_interrupted:
                    log.info("%s: skipped a pallet call inside an interrupted Utility.batch", where)
                    continue
                proto = by_chain_name.get(pcall.get("function"))
                if proto is None:
                    log.info("%s: skipped pallet call %s (not configured)", where, pcall.get("function"))
                    continue
                at, position = position, position + 1
                if proto == BondVerifier.NAME:
                    log.warning("%s: ignored a pallet bond_verifier from %s (unfunded_bond)", where, origin)
                    ignored.append(
                        Ignored.of(at, origin, pcall.get("raw"), "unfunded_bond", PALLET_BOND_IGNORED)
                    )
                    continue
                try:
                    calls.append((origin, self._decode_pallet_call(proto, pcall)))
                except TransportError:
                    raise  # the connection, not the call: the block is read again, never half-read
                except Exception as exc:
                    reason = (
                        "bad_fields"
                        if isinstance(exc, (CallError, ValueError, TypeError))
                        else "decoder_fault"
                    )
                    log.warning(
                        "%s: skipped malformed %s call (%s): %s", where, proto, reason, type(exc).__name__
                    )
                    ignored.append(Ignored.of(at, origin, pcall.get("raw"), reason))
        return Block(number=number, hash=hex_bytes(block_hash), calls=tuple(calls), timestamp=timestamp,
                     ignored=tuple(ignored))

    def events(self, number: int) -> list[tuple[str, Any]]:
        """The configured pallet events of finalized block `number`, as (name, attributes)."""
        block_hash = self._finalized_hash(number)
        evs = self.client.call(
            f"events of block {number}", lambda si: [e.value for e in si.get_events(block_hash=block_hash)]
        )
        wanted = set(self.config.events)
        return [
            (e["event_id"], e.get("attributes"))
            for e in evs
            if e.get("module_id") == self.config.pallet and e.get("event_id") in wanted
        ]

    def _decode_pallet_call(self, proto: str, pcall: Mapping[str, Any]) -> Call:
        cls = CALL_TYPES[proto]
        values = {a.get("name"): a.get("value") for a in pcall.get("args") or []}
        if set(values) != set(cls.FIELDS):
            raise CallError(
                f"arguments ({', '.join(map(str, values))}) differ from ({', '.join(cls.FIELDS)})"
            )
        options: dict[str, list[Any]] = {}
        for name, v in values.items():
            options[name] = _field_readings(v)
        # Text-or-hex readings are ambiguous; the one that re-encodes to the bytes on chain wins.
        want = pcall["raw"]
        combos: list[dict[str, Any]] = [{}]
        for name, opts in options.items():
            combos = [dict(c, **{name: o}) for c in combos for o in opts]
        cfg = self.config
        for combo in combos[:16]:
            try:
                call = cls(**combo)
            except CallError:
                continue
            data = self.client.call(
                "encode pallet call",
                lambda si, call=call: bytes(
                    si.compose_call(cfg.pallet, cfg.calls[proto], _pallet_args(call)).data.data
                ),
            )
            if data == want:
                return call
        raise CallError("no reading of the arguments re-encodes to the call on chain")


def _field_readings(v: Any) -> list[Any]:
    if isinstance(v, list):
        # A list of hashes (a Merkle proof) comes as hex text; a list of text (an opening's
        # mirrors) as the text itself. Both readings are offered; the re-encoding picks one.
        out: list[Any] = []
        try:
            out.append([hex_bytes(x) if isinstance(x, str) else x for x in v])
        except ValueError:
            pass
        if v and all(isinstance(x, str) for x in v):
            out.append(list(v))
        return out or [v]
    if isinstance(v, str):
        out: list[Any] = [v, v.encode("utf-8")]
        if v.startswith("0x"):
            try:
                out.insert(0, bytes.fromhex(v[2:]))
            except ValueError:
                pass
        return out
    return [v]


def _pallet_args(call: Call) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in call.to_wire().items()}


def _walk_pallet(call: Mapping[str, Any], pallet: str, *, batch: bool):
    """(pallet call, inside a non-atomic batch?) for every call of `pallet` in a call tree."""
    module, function = call.get("module"), call.get("function")
    if module == pallet:
        yield call, batch
    inner_batch = batch or (module == "Utility" and function != "batch_all")
    for inner in call.get("inner") or ():
        yield from _walk_pallet(inner, pallet, batch=inner_batch)
