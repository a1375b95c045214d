"""The dev chain: sealing, hashing, shared use by several OS processes, and refusals."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chain.calls import CommitWitness, decode_call, encode_call
from chain.dev import DevChain, DevTransport, block_hash, genesis_hash
from chain.protocol import ProtocolParams
from chain.substrate import PalletTransport, RemarkTransport
from chain.transport import Transport, TransportError
from commitments.hashing import digest

REPO = Path(__file__).resolve().parents[2]


def call(i: int) -> CommitWitness:
    return CommitWitness(digest("pot/test/c", i), digest("pot/test/m", i))


def test_new_chain_has_genesis(tmp_path):
    t = DevTransport(tmp_path / "c.db", "alice")
    assert t.finalized_head() == 0
    g = t.block(0)
    assert g.hash == genesis_hash() and g.calls == ()
    assert t.chain.sealing == "instant" and t.chain.verify() == []


def test_instant_submit_seals_a_block(tmp_path):
    t = DevTransport(tmp_path / "c.db", "miner-1")
    r = t.submit([call(1), call(2)])
    assert r.block_number == 1 and len(r.tx_hash) == 32
    b = t.block(1)
    assert b.hash == r.block_hash
    assert b.calls == (("miner-1", call(1)), ("miner-1", call(2)))
    raw = t.chain.raw_block(1)
    assert b.hash == block_hash(genesis_hash(), 1, raw[2], [("miner-1", encode_call(call(1))),
                                                           ("miner-1", encode_call(call(2)))])
    with pytest.raises(TransportError, match="block 2 is not sealed yet"):
        t.block(2)


def test_interval_sealing(tmp_path):
    path = tmp_path / "c.db"
    t = DevTransport(path, "alice", sealing="interval")
    r = t.submit([call(1)], wait=False)
    assert r.block_number is None and t.chain.pending() == 1
    with pytest.raises(TransportError, match="is the sealer"):
        t.submit([call(2)], timeout=0.3)
    stop = threading.Event()
    sealer = DevChain(path)
    th = threading.Thread(target=sealer.run_sealer, args=(0.05, stop.is_set), daemon=True)
    th.start()
    try:
        r3 = t.submit([call(3)], timeout=10)
        assert r3.block_number is not None and r3.block_number >= 1
        time.sleep(0.3)
        assert t.finalized_head() > r3.block_number  # empty blocks keep coming: windows pass
    finally:
        stop.set()
        th.join(5)
    found = [c for n in range(1, t.finalized_head() + 1) for _, c in t.block(n).calls]
    assert found == [call(1), call(2), call(3)]
    assert t.chain.pending() == 0 and t.chain.verify() == []


def test_foreign_payloads_are_skipped(tmp_path):
    t = DevTransport(tmp_path / "c.db", "alice")
    t.submit_payloads([b"hello", b"pot1\xff", encode_call(call(7))])
    assert t.block(1).calls == (("alice", call(7)),)


def test_follow_yields_blocks_in_order(tmp_path):
    t = DevTransport(tmp_path / "c.db", "alice")
    for i in range(3):
        t.submit([call(i)])
    seen = []
    for b in t.follow(0, poll=0.01, stop=lambda: len(seen) >= 3):
        seen.append(b.number)
    assert seen == [1, 2, 3]


def test_tampering_is_detected(tmp_path):
    path = tmp_path / "c.db"
    t = DevTransport(path, "alice")
    t.submit([call(1)])
    t.submit([call(2)])
    db = sqlite3.connect(path)
    db.execute("UPDATE txs SET payload = ? WHERE block = 1", (encode_call(call(9)),))
    db.commit()
    db.close()
    assert t.chain.verify() == ["block 1: hash does not match its contents"]


def test_refusals(tmp_path):
    with pytest.raises(TransportError, match="dev account names"):
        DevTransport(tmp_path / "c.db", "bad name!")
    t = DevTransport(tmp_path / "c.db", "alice")
    with pytest.raises(TransportError, match="at least one call"):
        t.submit([])
    with pytest.raises(TransportError, match="cannot encode"):
        t.submit(["not a call"])
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(TransportError, match="not a usable dev chain file"):
        DevTransport(junk)
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE accounts (x)")
    db.commit()
    db.close()
    with pytest.raises(TransportError, match="not a dev chain"):
        DevTransport(other)
    with pytest.raises(TransportError, match="sealing must be"):
        DevTransport(tmp_path / "c.db", sealing="sometimes")


def test_params_recorded(tmp_path):
    t = DevTransport(tmp_path / "c.db")
    assert t.protocol_params() is None
    p = ProtocolParams(commit_window=7, forced_challenge_steps=(7,))
    t.record_params(p)
    assert DevTransport(tmp_path / "c.db").protocol_params() == p


def test_protocol_params_is_part_of_every_transport():
    # Declared on the base with its default (the chain records none); only the dev chain records them.
    assert Transport.protocol_params(DevTransport.__new__(DevTransport)) is None
    assert RemarkTransport.protocol_params is PalletTransport.protocol_params is Transport.protocol_params
    assert DevTransport.protocol_params is not Transport.protocol_params


WRITER = """
import sys, time
from pathlib import Path
from chain.calls import CommitWitness
from chain.dev import DevTransport
from commitments.hashing import digest
path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = DevTransport(path, name)
go = Path(path + ".go")
while not go.exists():  # start together, so the writes really contend
    time.sleep(0.005)
for i in range(n):
    t.submit([CommitWitness(digest("pot/test/c", name, i), digest("pot/test/m", i))])
    time.sleep(0.002)
"""


def test_two_processes_write_at_once(tmp_path):
    path = tmp_path / "shared.db"
    DevTransport(path)  # create the file first so both writers open an existing chain
    n = 100
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(n)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name in ("w1", "w2")
    ]
    time.sleep(0.5)
    Path(str(path) + ".go").touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    t = DevTransport(path)
    assert t.finalized_head() == 2 * n  # instant sealing: one block per submission, none lost
    seen = {"w1": [], "w2": []}
    stamps = []
    for number in range(1, t.finalized_head() + 1):
        b = t.block(number)
        stamps.append(b.timestamp)
        for origin, c in b.calls:
            seen[origin].append(c.challenge_id)
    for name in seen:
        assert seen[name] == [digest("pot/test/c", name, i) for i in range(n)]
    assert stamps == sorted(stamps)
    assert t.chain.verify() == []


def test_decode_of_stored_payloads_round_trips(tmp_path):
    t = DevTransport(tmp_path / "c.db", "alice")
    t.submit([call(3)])
    (_, payload), = t.chain.raw_block(1)[3]
    assert decode_call(payload) == call(3)
