"""Authenticated snapshots: a chain-view snapshot carries a keyed BLAKE3 digest under the node's
snapshot key and its state is checked field by field, so an altered, re-keyed or malformed snapshot
is refused (load) or discarded and derived again from genesis (resume), never trusted or fatal."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain import protocol as P
from chain.calls import UnbondVerifier
from chain.dev import DevTransport
from chain.protocol import ProtocolState, SnapshotError
from chain.transport import Block
from chain.view import (
    SNAPSHOT_DOMAIN,
    SNAPSHOT_KEY_FILE,
    ChainView,
    SnapshotKeyError,
    seal_snapshot,
    snapshot_key,
)
from commitments import cbor
from tests.chain.runs import SyntheticRun, bond

PARAMS = P.ProtocolParams(challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2,
                          challenges_per_run=1, quorum_min_reveals=1, forced_challenge_steps=(3,))


def _chain(path) -> DevTransport:
    """A run challenged and resolved, a verifier bonded and unbonding: most of the state in use."""
    run = SyntheticRun(steps=4)
    miner = DevTransport(path, "miner")
    miner.record_params(PARAMS)
    v1 = DevTransport(path, "v1")
    v1.submit([bond(PARAMS.verifier_stake + 30)])
    miner.submit([run.register()])
    miner.submit([run.submit_full_root()])
    for _ in range(6):
        miner.seal()
    v1.submit([UnbondVerifier(30)])
    return miner


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(chain path, snapshot path, the view saved there, the snapshot's bytes)."""
    d = tmp_path_factory.mktemp("snap")
    transport = _chain(d / "c.db")
    view = ChainView(transport, PARAMS)
    view.sync()
    assert view.state.runs and view.state.challenges and view.state.unbonding
    snap = d / "view" / "state.cbor"
    view.save(snap)
    return d / "c.db", snap, view, snap.read_bytes()


def _fresh(tmp_path, saved, data: bytes):
    """A copy of the snapshot folder (same key) whose snapshot holds `data`."""
    chain, snap, _, _ = saved
    folder = tmp_path / "view"
    folder.mkdir(exist_ok=True)
    (folder / SNAPSHOT_KEY_FILE).write_bytes((snap.parent / SNAPSHOT_KEY_FILE).read_bytes())
    os.chmod(folder / SNAPSHOT_KEY_FILE, 0o600)
    path = folder / "state.cbor"
    path.write_bytes(data)
    return DevTransport(chain, "observer"), path


def _refused_then_rederived(tmp_path, saved, data: bytes, match: str) -> None:
    transport, path = _fresh(tmp_path, saved, data)
    with pytest.raises(SnapshotError, match=match):
        ChainView.load(transport, path, PARAMS)
    view = ChainView.resume(transport, path, PARAMS)
    assert view.cursor == 0 and view.discarded is not None and str(path) in view.discarded
    assert not path.exists() and path.with_name(path.name + ".refused").read_bytes() == data
    view.sync()
    assert view.state.to_cbor() == saved[2].state.to_cbor()


def test_an_honest_snapshot_is_sealed_with_a_private_key_and_resumes(tmp_path, saved):
    chain, snap, view, data = saved
    key_file = snap.parent / SNAPSHOT_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_bytes()) == 32
    assert stat.S_IMODE(snap.stat().st_mode) == 0o600
    assert cbor.decode(data)[0] == SNAPSHOT_DOMAIN and len(cbor.decode(data)[-1]) == 32
    resumed = ChainView.resume(DevTransport(chain, "observer"), snap, PARAMS)
    assert resumed.discarded is None and resumed.cursor == view.cursor and resumed.state == view.state
    assert snapshot_key(snap.parent) == key_file.read_bytes()  # made once, read back after


@pytest.mark.parametrize("where", [1, 40, -300, -40, -1])
def test_one_flipped_byte_is_refused_and_the_state_derived_again(tmp_path, saved, where):
    data = bytearray(saved[3])
    data[where] ^= 0x01
    _refused_then_rederived(tmp_path, saved, bytes(data), "unusable chain-view snapshot")


def test_a_snapshot_resealed_under_another_key_is_refused(tmp_path, saved):
    _, _, view, data = saved
    _, cursor, cursor_hash, state_bytes, _ = cbor.decode(data)
    state = ProtocolState.from_cbor(state_bytes)
    state.vbonds["v1"] = 10**9  # what a forger would want, digested under its own key
    forged = seal_snapshot(os.urandom(32), SNAPSHOT_DOMAIN, cursor, cursor_hash, state.to_cbor())
    _refused_then_rederived(tmp_path, saved, forged, "does not match this node's snapshot key")


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("runs", 0, "size"), "5", r"runs\[0\].size must be an integer"),
        (("runs", 0, "root"), b"\x00" * 31, r"runs\[0\].root must be 32 bytes, got 31"),
        (("challenges", 0, "committee"), "v1", r"challenges\[0\].committee must be a list"),
        (("challenges", 0, "verdict"), "maybe", r"verdict must be one of honest, fraud, inconclusive"),
        (("challenges", 0, "reveal_deadline"), -1, r"reveal_deadline must be an integer in 0\.\."),
        (("challenges", 0, "run_id"), b"\x01" * 32, "lists challenge .*, which is not its"),
        (("head",), -5, r"head must be an integer in -1\.\."),
        (("unbonding", "v1"), [[1, 2, 3]], "an unbonding entry is"),
        (("vbonds", "nobody"), 5, "never bonded as verifiers"),
        (("runs", 0, "extra"), 1, r"runs\[0\]: unknown field"),
        # protocol v3's fields
        (("staked", "v1"), 10**9, "'v1' has 1000000000 staked on escalations but 0 reserved"),
        (("disputes",), [[b"\x01" * 32, 3]], r"disputes\[0\] must be \[round id, round, reopened\]"),
        (("runs", 0, "escrow_left"), 10**9, "holds more escrow than it escrowed"),
        (("runs", 0, "settled"), 1, r"runs\[0\].settled must be true or false"),
        (("challenges", 0, "held"), [1], r"challenges\[0\].held must be a map"),
        (
            ("challenges", 0, "escalations"),
            {"v1": ["maybe", 1]},
            r"escalations\['v1'\] verdict must be one of honest, fraud",
        ),
        (("challenges", 0, "queued"), 0, r"challenges\[0\].queued must be true or false"),
        (("challenges", 0, "dispute"), 1, r"challenges\[0\].dispute must be true or false"),
        (("burned",), -1, r"burned must be an integer in 0\.\."),
    ],
)
def test_a_well_keyed_but_malformed_state_is_refused_naming_the_field(tmp_path, saved, path, value, match):
    """What an older bug could have written: the digest checks, the state does not."""
    _, snap, _, data = saved
    _, cursor, cursor_hash, state_bytes, _ = cbor.decode(data)
    obj = cbor.decode(state_bytes)
    target = obj
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    sealed = seal_snapshot(snapshot_key(snap.parent), SNAPSHOT_DOMAIN, cursor, cursor_hash, cbor.encode(obj))
    _refused_then_rederived(tmp_path, saved, sealed, match)


def test_a_state_ahead_of_its_cursor_and_an_unkeyed_older_file_are_refused(tmp_path, saved):
    _, snap, view, data = saved
    _, cursor, cursor_hash, state_bytes, _ = cbor.decode(data)
    key = snapshot_key(snap.parent)
    ahead = seal_snapshot(key, SNAPSHOT_DOMAIN, cursor - 1, None, state_bytes)
    _refused_then_rederived(tmp_path, saved, ahead, f"of block {cursor}, after its cursor {cursor - 1}")
    unkeyed = cbor.encode(["pot/chain-view/v1", cursor, cursor_hash, state_bytes])
    _refused_then_rederived(tmp_path, saved, unkeyed, "written without a key digest")


def test_a_damaged_key_file_is_a_clear_error_and_a_loose_one_is_narrowed(tmp_path):
    (tmp_path / SNAPSHOT_KEY_FILE).write_bytes(b"short")
    with pytest.raises(SnapshotKeyError, match="holds 5 bytes, not 32: remove it"):
        snapshot_key(tmp_path)
    (tmp_path / SNAPSHOT_KEY_FILE).write_bytes(b"k" * 32)
    os.chmod(tmp_path / SNAPSHOT_KEY_FILE, 0o644)
    assert snapshot_key(tmp_path) == b"k" * 32
    assert stat.S_IMODE((tmp_path / SNAPSHOT_KEY_FILE).stat().st_mode) == 0o600


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_snapshot_files_load_equal_or_are_refused(tmp_path, saved, data):
    """Whatever bytes the file holds: the loader gives the saved state, or SnapshotError."""
    chain, snap, view, honest = saved
    raw = bytearray(honest)
    for _ in range(data.draw(st.integers(0, 4), label="edits")):
        i = data.draw(st.integers(0, len(raw) - 1), label="at")
        op = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]), label="op")
        if op == "flip":
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i:i + data.draw(st.integers(1, 64))]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        if not raw:
            raw = bytearray(b"\x00")
    path = snap.parent / f"mutated-{os.getpid()}.cbor"
    path.write_bytes(bytes(raw))
    try:
        loaded = ChainView.load(DevTransport(chain, "observer"), path, PARAMS)
    except SnapshotError:
        assert bytes(raw) != honest
    else:
        assert loaded.cursor == view.cursor and loaded.state == view.state
    finally:
        path.unlink()


@settings(max_examples=300, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_state_bytes_decode_to_a_usable_state_or_are_refused(edits):
    """Below the digest: ProtocolState.from_cbor on arbitrary mutations of a busy state either
    refuses with SnapshotError or gives a state that snapshots to itself and that on_block works
    on without raising (its items are contained)."""
    raw = bytearray(_busy_state_bytes())
    for at, value in edits:
        raw[at % len(raw)] = value
    try:
        state = ProtocolState.from_cbor(bytes(raw))
    except SnapshotError:
        return
    assert ProtocolState.from_cbor(state.to_cbor()) == state
    for n in range(max(state.head, 0) + 1, max(state.head, 0) + 4):
        P.on_block(state, Block(n, bytes([n % 256]) * 32))
    ProtocolState.from_cbor(state.to_cbor())


_BUSY: list[bytes] = []


def _busy_state_bytes() -> bytes:
    if not _BUSY:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            view = ChainView(_chain(Path(d) / "c.db"), PARAMS)
            view.sync()
            _BUSY.append(view.state.to_cbor())
    return _BUSY[0]
