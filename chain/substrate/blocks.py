"""Block decoding: a finalized block's extrinsics as call trees cut from their exact bytes, and
what its events say about each extrinsic (success, failure, executed remarks, interrupted batches,
balance transfers)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from scalecodec.base import ScaleBytes
from substrateinterface import SubstrateInterface
from substrateinterface.exceptions import SubstrateRequestException

from chain.substrate.client import SubstrateClient
from chain.substrate.scale import hex_bytes, pubkey, read_compact

log = logging.getLogger(__name__)

_BATCH_CALLS = {"batch", "batch_all", "force_batch"}


@dataclass
class Executed:
    """What the events say about one extrinsic."""

    success: bool = False
    failure: Any = None
    remarks: list[tuple[bytes, bytes]] = field(default_factory=list)  # (sender pubkey, remark hash)
    batch_interrupted: bool = False
    # (from pubkey, to pubkey, planck) of each Balances.Transfer event, in order: what bond
    # remarks of this extrinsic are paid with (chain.substrate.bonds).
    transfers: list[tuple[bytes, bytes, int]] = field(default_factory=list)


def read_block(
    client: SubstrateClient, block_hash: str, number: int
) -> tuple[list[Any], dict[int, Executed], float | None]:
    """(decoded extrinsics or None per undecodable one, per-extrinsic outcome, timestamp) of the
    block `number` whose hash is `block_hash`."""

    def run(si: SubstrateInterface):
        reply = si.rpc_request("chain_getBlock", [block_hash])
        if "error" in reply:
            raise SubstrateRequestException(reply["error"])
        body = reply.get("result") or {}
        exts = (body.get("block") or {}).get("extrinsics") or []
        si.init_runtime(block_hash=block_hash)
        cls = si.runtime_config.get_decoder_class("Extrinsic")
        decoded: list[Any] = []
        for idx, hexdata in enumerate(exts):
            try:
                raw = hex_bytes(hexdata)
                ext = cls(
                    data=ScaleBytes(bytearray(raw)),
                    metadata=si.metadata,
                    runtime_config=si.runtime_config,
                )
                ext.decode()
                # The call is the tail of the extrinsic; its bytes are walked exactly below.
                call_start = ext.value_object["call"].data_start_offset
                decoded.append(
                    {"address": ext.value.get("address"), "call": call_tree(si, raw[call_start:])}
                )
            except Exception as exc:  # one odd extrinsic must not hide the others
                log.warning("block %d: extrinsic %d skipped: cannot decode it (%s)", number, idx, exc)
                decoded.append(None)
        events = si.get_events(block_hash=block_hash)
        return decoded, [e.value for e in events]

    decoded, events = client.call(f"read block {number}", run)
    outcome: dict[int, Executed] = {}
    for pos, ev in enumerate(events):
        try:
            _record_event(ev, outcome)
        except Exception as exc:  # one odd event must not stop the block (every node skips the same one)
            log.warning("block %d: event %d skipped: cannot read it (%s)", number, pos, type(exc).__name__)
    timestamp = None
    for ext in decoded:
        call = (ext or {}).get("call") or {}
        if call.get("module") == "Timestamp" and call.get("function") == "set":
            try:
                timestamp = int(call["args"][0]["value"]) / 1000.0
            except Exception:  # an odd timestamp is no timestamp, never a stopped block
                pass
    return decoded, outcome, timestamp


def _record_event(ev: Any, outcome: dict[int, Executed]) -> None:
    if not isinstance(ev, dict):
        return
    if ev.get("phase") != "ApplyExtrinsic" and not (
        isinstance(ev.get("phase"), dict) and "ApplyExtrinsic" in ev["phase"]
    ):
        return
    idx = ev.get("extrinsic_idx")
    if not isinstance(idx, int) or isinstance(idx, bool):
        return
    ex = outcome.setdefault(idx, Executed())
    mod, name, attrs = ev.get("module_id"), ev.get("event_id"), ev.get("attributes")
    if mod == "System" and name == "ExtrinsicSuccess":
        ex.success = True
    elif mod == "System" and name == "ExtrinsicFailed":
        ex.failure = attrs
    elif mod == "System" and name == "Remarked" and isinstance(attrs, dict):
        try:
            ex.remarks.append((pubkey(attrs["sender"]), hex_bytes(attrs["hash"])))
        except (KeyError, ValueError, TypeError):
            return
    elif mod == "Utility" and name in ("BatchInterrupted", "ItemFailed"):
        ex.batch_interrupted = True
    elif mod == "Balances" and name == "Transfer" and isinstance(attrs, dict):
        try:
            src, dst, amount = pubkey(attrs["from"]), pubkey(attrs["to"]), attrs["amount"]
        except (KeyError, ValueError, TypeError):
            return
        if isinstance(amount, int) and not isinstance(amount, bool) and amount >= 0:
            ex.transfers.append((src, dst, amount))


def call_tree(si: SubstrateInterface, data: bytes, depth: int = 0) -> dict[str, Any]:
    """One call decoded from its exact bytes: names, args, raw bytes, and batch children.

    Remark bytes are cut from the raw call rather than taken from the decoder, which turns bytes
    into text or 0x-hex ambiguously; batch children are decoded one by one from their own bytes.
    """
    obj = si.runtime_config.create_scale_object(
        "Call", data=ScaleBytes(bytearray(data)), metadata=si.metadata
    )
    value = obj.decode(check_remaining=False)
    raw = bytes(data[: obj.data.offset])
    node: dict[str, Any] = {
        "module": value["call_module"],
        "function": value["call_function"],
        "args": value["call_args"],
        "raw": raw,
        "inner": [],
    }
    if node["module"] == "Utility" and node["function"] in _BATCH_CALLS and depth < 8:
        count, pos = read_compact(raw, 2)
        for _ in range(count):
            child = call_tree(si, raw[pos:], depth + 1)
            node["inner"].append(child)
            pos += len(child["raw"])
    elif node["module"] == "System" and node["function"] in ("remark", "remark_with_event"):
        length, pos = read_compact(raw, 2)
        node["remark"] = raw[pos : pos + length]
    return node
