"""The protocol snapshot a follower restarts from: ChainView.load on a file written from the
bytes (the outer [domain, cursor, hash, state] record), and ProtocolState.from_cbor on the bytes
themselves. Refusal: SnapshotError; a restored state snapshots again. The file's key digest is
under a fixed key, so the seeds pass it and mutations reach the decoder behind it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from chain.dev import DevTransport
from chain.protocol.state import ProtocolState, SnapshotError
from chain.view import ChainView
from commitments.hashing import digest

_DIR = Path(tempfile.mkdtemp(prefix="pot-fuzz-snapshot-"))
_PATH = _DIR / "view.snapshot"
_TRANSPORT = DevTransport(_DIR / "chain.db", "v1")  # genesis only: block 0
_KEY = digest("pot/fuzz/snapshot-key/v1")


def TestOneInput(data: bytes) -> None:
    try:
        state = ProtocolState.from_cbor(data)
    except SnapshotError:
        pass
    else:
        ProtocolState.from_cbor(state.to_cbor())
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        view = ChainView.load(_TRANSPORT, _PATH, key=_KEY)
    except SnapshotError:
        return
    finally:
        os.unlink(_PATH)
    view.state.to_cbor()


def seeds() -> dict[str, bytes]:
    from tests.fuzz.targets import dev_block

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        # A view of the honest dev run, saved at its head; the state part alone is a seed too.
        view = dev_block.apply(dev_block.seeds()["honest-run"])
        out["state"] = view.state.to_cbor()
        empty = ChainView(_TRANSPORT)
        empty.sync()
        empty.save(Path(tmp) / "s", key=_KEY)
        out["view-genesis"] = (Path(tmp) / "s").read_bytes()
        # At block 0 with its hash: load checks the hash against this chain's block 0.
        empty.cursor_hash = _TRANSPORT.block(0).hash
        empty.save(Path(tmp) / "g", key=_KEY)
        out["view-genesis-hashed"] = (Path(tmp) / "g").read_bytes()
        view.cursor_hash = None
        view.save(Path(tmp) / "t", key=_KEY)
        out["view-unhashed"] = (Path(tmp) / "t").read_bytes()
    return out
