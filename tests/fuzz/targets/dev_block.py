"""The dev transport's block processing: blocks of arbitrary (origin, payload) transactions are
sealed in a fresh dev-chain file and applied by ChainView.sync, the code a node follows a chain
with. Nothing may come out of it: every payload is a call, a skipped payload or a refusal event.

Input framing (tests/fuzz/targets/_script.py): records of one byte (bit 7: seal a block first;
bits 0-2: the sender) and a length-prefixed payload; the last block is sealed at the end.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import chain.dev
from chain.calls import CallDecodeError, read_payload
from chain.dev import DevTransport
from chain.protocol.events import CallRefused, RemarkIgnored
from chain.protocol.params import ProtocolParams
from chain.protocol.refusals import ProtocolError
from chain.view import ChainView
from tests.fuzz.targets._script import Reader, Writer

ACCOUNTS = ("miner", "v1", "v2", "v3", "v4", "alice", "bob", "mallory")
MAX_RECORDS = 64
PARAMS = ProtocolParams(commit_window=2, reveal_window=2, opening_deadline=2, challenge_delay=1,
                        challenges_per_run=1, quorum_min_reveals=2)
_DIR = Path(tempfile.mkdtemp(prefix="pot-fuzz-dev-"))
_clock = itertools.count()


def _now_ms() -> int:
    # A fixed clock: block hashes, and so challenge draws, depend only on the input.
    return 1_700_000_000_000 + 1000 * next(_clock)


chain.dev._now_ms = _now_ms


def apply(data: bytes) -> ChainView:
    global _clock
    _clock = itertools.count()
    path = _DIR / "chain.db"
    transport = DevTransport(path, "miner", sealing="interval")
    try:
        r = Reader(data)
        payloads: list[bytes] = []
        while r.more() and len(payloads) < MAX_RECORDS:
            tag = r.byte()
            if tag & 0x80:
                transport.chain.seal()
            payloads.append(r.blob())
            transport.chain.append(ACCOUNTS[tag & 7], [payloads[-1]], seal=False)
        transport.chain.seal()
        view = ChainView(transport, PARAMS)
        view.sync()
        if view.cursor != transport.finalized_head():
            raise AssertionError(f"the view stopped at block {view.cursor} before the head")
        _check_events(view, payloads)
        return view
    finally:
        transport.close()
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(f"{path}{suffix}")
            except FileNotFoundError:
                pass


def _check_events(view: ChainView, payloads: list[bytes]) -> None:
    ignored = view.of(RemarkIgnored)
    # One per pot1 payload that is no call, and per near miss of the prefix (chain.calls.near_miss).
    expected = sum(1 for p in payloads if isinstance(read_payload(p), CallDecodeError))
    if len(ignored) != expected:
        raise AssertionError(
            f"{len(ignored)} RemarkIgnored events for {expected} pot1 payloads that are no call"
        )
    faults = [e for e in ignored if e.reason in ("decoder_fault", "transport_fault")]
    faults += [e for e in view.of(CallRefused) if e.refusal == ProtocolError.code]
    if faults:
        raise AssertionError(f"a fault was contained, not refused: {faults[0]!r:.300}")


def TestOneInput(data: bytes) -> None:
    apply(data)


def seeds() -> dict[str, bytes]:
    from chain.calls import encode_call
    from tests.chain.runs import SyntheticRun, bond, witness

    run = SyntheticRun(steps=4)
    # Block 1 bonds v1..v3 and registers, block 2 roots, block 3 issues the challenge (v1..v3 its
    # committee).
    prefix = Writer()
    for v in (1, 2, 3):
        prefix.byte(v).blob(encode_call(bond(PARAMS.verifier_stake)))
    prefix = (
        prefix.byte(0)
        .blob(encode_call(run.register()))
        .byte(0x80)
        .blob(encode_call(run.submit_full_root()))
        .byte(0x85)
        .blob(b"")
        .bytes()
    )
    view = apply(prefix)
    (cid, ch), = view.state.challenges.items()
    pairs = [witness(cid, ACCOUNTS[v], run.value_hash(ch.step)) for v in (1, 2, 3)]
    honest = Writer().byte(0x80).blob(encode_call(run.opening(cid, ch.step)))
    for v, (commit, _) in zip((1, 2, 3), pairs, strict=True):
        honest.byte((0x80 if v == 1 else 0) | v).blob(encode_call(commit))
    honest.byte(0x85).blob(b"").byte(0x85).blob(b"")
    for v, (_, reveal) in zip((1, 2, 3), pairs, strict=True):
        honest.byte((0x80 if v == 1 else 0) | v).blob(encode_call(reveal))
    for _ in range(3 + PARAMS.escalation_window):  # past the reveal and escalation windows
        honest.byte(0x85).blob(b"")
    foreign = Writer().byte(5).blob(b"hello").byte(0x86).blob(b"pot1\xa0").byte(0x87).blob(b"pot1").bytes()
    return {"registered": prefix, "honest-run": prefix + honest.bytes(), "foreign": foreign}
