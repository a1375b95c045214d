"""The Substrate remark transport's block reading (chain/substrate/blocks.py and remark.py): a
block's decoded extrinsics and events, built from the fuzz bytes, go through RemarkTransport.block
exactly as a node's RPC answer would. Nothing may come out but a Block; its calls are only
executed, well-formed pot1 remarks of a usable signer; an ignored remark carries a refusal code,
never a contained fault.

The RPC choke point (SubstrateClient) answers from the built block; everything behind it is real.
Input framing (_script.py): extrinsics, then events, each chosen by a byte from the shapes below.
"""

from __future__ import annotations

from typing import Any

from chain.calls import CALL_TYPES
from chain.substrate.scale import blake2_256
from tests.fuzz.substrate_rpc import remark_transport
from tests.fuzz.targets._script import Reader, Writer

ALICE = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
ALICE_HEX = "0xd43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d"
ADDRESSES: tuple[Any, ...] = (
    ALICE,
    ALICE_HEX,
    {"Id": ALICE},
    ["Id", ALICE],
    "5Grw",
    "0x12",
    5,
    None,
    {"Id": 7},
    ["Id"],
    b"\1" * 32,
    "0x" + "zz" * 32,
)
MODULES = (
    ("System", "remark_with_event"),
    ("System", "remark"),
    ("Utility", "batch"),
    ("Utility", "batch_all"),
    ("Utility", "force_batch"),
    ("Timestamp", "set"),
    ("Balances", "transfer"),
    ("System", None),
)
EVENTS = (("System", "ExtrinsicSuccess"), ("System", "ExtrinsicFailed"), ("System", "Remarked"),
          ("Utility", "BatchInterrupted"), ("Utility", "ItemFailed"), ("Balances", "Transfer"), (None, None))
PHASES: tuple[Any, ...] = ("ApplyExtrinsic", "Finalization", "Initialization", None, {"ApplyExtrinsic": 0}, 3)
VALUES: tuple[Any, ...] = (
    None,
    0,
    -1,
    2**70,
    "",
    "x",
    [],
    {},
    [{"value": 1}],
    [{"value": "soon"}],
    {"value": None},
    [None],
    b"\0",
)


def _call(r: Reader, payloads: list[bytes], depth: int) -> Any:
    kind = r.byte()
    module, function = MODULES[kind % len(MODULES)]
    node: dict[str, Any] = {"module": module, "function": function, "args": VALUES[r.byte() % len(VALUES)],
                            "raw": b"", "inner": []}
    if module == "System" and function is not None:
        node["remark"] = r.blob()
        payloads.append(node["remark"])
    elif module == "Utility":
        for _ in range(r.byte() % 4 if depth < 4 else 0):
            node["inner"].append(_call(r, payloads, depth + 1))
    elif module == "Timestamp":
        node["args"] = [{"value": VALUES[r.byte() % len(VALUES)] if r.byte() & 1 else 1_700_000_000_000}]
    return node


def build(data: bytes) -> tuple[list[Any], list[Any]]:
    r = Reader(data)
    exts: list[Any] = []
    payloads: list[bytes] = []
    for _ in range(r.byte() % 6):
        # What read_block's own decoding gives: None for an undecodable extrinsic, else the
        # decoder's address (any shape) and a call tree (call_tree builds only dicts).
        shape = r.byte() % 3
        if shape == 0:
            exts.append(None)
        elif shape == 1:
            exts.append({"address": ADDRESSES[r.byte() % len(ADDRESSES)], "call": _call(r, payloads, 0)})
        else:
            exts.append({"address": None, "call": _call(r, payloads, 0)})
    events: list[Any] = []
    while r.more() and len(events) < 32:
        phase = PHASES[r.byte() % len(PHASES)]
        idx = r.byte()
        module, name = EVENTS[r.byte() % len(EVENTS)]
        if module == "System" and name == "Remarked":
            sender = ADDRESSES[r.byte() % len(ADDRESSES)]
            which = r.byte()
            # Mostly the true hash of one of the block's remarks, so that the decoder is reached.
            digest: Any = (
                "0x" + blake2_256(payloads[which % len(payloads)]).hex()
                if payloads and which < 0xF0
                else VALUES[which % len(VALUES)]
            )
            attrs: Any = {"sender": sender, "hash": digest}
        else:
            attrs = VALUES[r.byte() % len(VALUES)]
        events.append({"phase": {"ApplyExtrinsic": idx} if phase == {"ApplyExtrinsic": 0} else phase,
                       "extrinsic_idx": None if idx == 0xFF else idx, "module_id": module, "event_id": name,
                       "attributes": attrs})
    return exts, events


_TRANSPORT, _CLIENT = remark_transport()


def TestOneInput(data: bytes) -> None:
    _CLIENT.block = build(data)
    block = _TRANSPORT.block(3)
    if block.number != 3 or not isinstance(block.calls, tuple):
        raise AssertionError(f"block 3 read as {block!r:.200}")
    for origin, call in block.calls:
        if not (isinstance(origin, str) and origin and type(call) in CALL_TYPES.values()):
            raise AssertionError(f"a block call is not a protocol call: {origin!r:.60} {call!r:.60}")
    for ig in block.ignored:
        # The reader contains its own faults so that a node reads on; here they are crashes.
        if ig.reason in ("decoder_fault", "transport_fault"):
            raise AssertionError(f"a fault was contained in block reading: {ig!r:.300}")


def seeds() -> dict[str, bytes]:
    from chain.calls import encode_call
    from tests.fuzz.targets.remarks import sample_calls

    calls = [encode_call(c) for c in sample_calls()]
    # One extrinsic from Alice: a batch_all of two remarks, then its success and Remarked events.
    batch = Writer().byte(1).byte(1).byte(0).byte(3).byte(0).byte(2)
    batch.byte(0).byte(0).blob(calls[3]).byte(0).byte(0).blob(calls[4])
    for which in (0, 1):
        batch.byte(4).byte(0).byte(2).byte(0).byte(which)
    batch.byte(4).byte(0).byte(0).byte(0)
    single = Writer().byte(1).byte(1).byte(0).byte(0).byte(0).blob(calls[0])
    single.byte(4).byte(0).byte(2).byte(1).byte(0).byte(4).byte(0).byte(0).byte(0)
    timestamp = Writer().byte(1).byte(2).byte(5).byte(0).byte(0).bytes()
    return {"batch": batch.bytes(), "register": single.bytes(), "timestamp": timestamp}
