"""Hostile-input probes, second round: a block or snapshot that would stop the chain follower.
Registered in devnet.hostile."""

from __future__ import annotations

from pathlib import Path

from chain.dev import DevTransport
from chain.protocol import ProtocolState, rules
from chain.protocol.events import BlockWorkFailed
from chain.view import SNAPSHOT_DOMAIN, ChainView, seal_snapshot, snapshot_key
from commitments import cbor
from devnet.hostile import _honest_registration, _owned, probe
from devnet.lab import Lab, bond_seats

KIND = "a block or snapshot the follower chokes on"


def _two_runs(lab: Lab, name: str) -> tuple[Path, bytes, bytes]:
    """A fresh instant dev chain with two complete runs of one miner, sealed past their first draw."""
    path = lab.dir / "hostile" / f"{name}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    miner = DevTransport(path, "miner", sealing="instant")
    miner.record_params(lab.params)
    bond_seats(path, lab.params)  # the committees' seats: no challenge is drawn without them
    ids = []
    for tag in ("follower-a", "follower-b"):
        run_id, nonce = _owned("miner", tag)
        calls = _honest_registration(lab, run_id, nonce)
        miner.submit(calls[:1])
        miner.submit(calls[1:])
        ids.append(run_id)
    for _ in range(lab.params.challenge_delay + 3):
        miner.seal()
    miner.close()
    return path, ids[0], ids[1]


@probe(
    "on-block-failure-contained",
    KIND,
    "record a failure inside a block's own protocol work (one run's challenge issuance crashing halfway) as "
    "BlockWorkFailed, undo it, advance the cursor, keep the other runs' work, and derive the same bytes on "
    "every follower",
)
def _on_block_failure(lab: Lab) -> tuple[bool, str, str]:
    path, poisoned_id, other_id = _two_runs(lab, "on-block-failure")
    real = rules._issue_first

    def poisoned(state, run, n, block_hash):
        if run.run_id == poisoned_id:
            run.drawn += 1  # a half-applied change the follower must undo
            raise RuntimeError("injected protocol fault")
        return real(state, run, n, block_hash)

    rules._issue_first = poisoned  # the fault is injected into the real on_block; the rest runs as on a node
    try:
        views = []
        for account in ("v1", "observer"):
            view = ChainView(DevTransport(path, account), lab.params)
            try:
                view.sync()
            except Exception as exc:
                return False, "chain", f"the follower raised {type(exc).__name__} at block {view.cursor + 1}"
            views.append(view)
    finally:
        rules._issue_first = real
    one, two = views
    head = one.transport.finalized_head()
    if one.cursor != head:
        return False, "chain", f"the cursor stopped at {one.cursor} of {head}"
    failed = one.of(BlockWorkFailed)
    if not failed or {(e.stage, e.subject) for e in failed} != {("issuance", poisoned_id.hex())}:
        return (
            False,
            "chain",
            f"the failure left {len(failed)} BlockWorkFailed records, not one per block for the run",
        )
    state = one.state
    if state.runs[poisoned_id].drawn or state.runs[poisoned_id].challenges:
        return False, "chain", "the failed issuance was not undone: the run kept a half-made draw"
    if not state.runs[other_id].challenges:
        return False, "chain", "the other run was not challenged: one failure stopped the stage"
    if state.to_cbor() != two.state.to_cbor() or [e.to_json() for e in one.events] != [
        e.to_json() for e in two.events
    ]:
        return False, "chain", "two followers of the same chain derived different states or events"
    return (
        True,
        "chain",
        (
            f"{len(failed)} BlockWorkFailed (issuance, {failed[0].error_type}) from block "
            f"{failed[0].block}, undone; cursor at the head {head}; the other run got "
            f"{len(state.runs[other_id].challenges)} challenge(s); two followers byte-identical"
        ),
    )


@probe("tampered-snapshot-rederived", KIND,
       "refuse a snapshot file with one flipped byte, one re-sealed under another key and one well-keyed but "
       "malformed, discard each with a warning and derive the same state again from genesis")
def _tampered_snapshot(lab: Lab) -> tuple[bool, str, str]:
    path, _, _ = _two_runs(lab, "tampered-snapshot")
    transport = DevTransport(path, "observer")
    honest = ChainView(transport, lab.params)
    honest.sync()
    snap = lab.dir / "hostile" / "tampered-snapshot" / "view.cbor"
    honest.save(snap)
    data = snap.read_bytes()
    _, cursor, cursor_hash, state_bytes, _ = cbor.decode(data)
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x04
    forged = ProtocolState.from_cbor(state_bytes)
    forged.verifiers.append("attacker")
    forged.vbonds["attacker"] = 1 << 40
    malformed = ProtocolState.from_cbor(state_bytes)
    run = next(iter(malformed.runs.values()))
    run.size = str(run.size)  # a wrong type, as an older bug could have written it
    cases = {
        "flipped byte": bytes(flipped),
        "re-keyed": seal_snapshot(bytes(32), SNAPSHOT_DOMAIN, cursor, cursor_hash, forged.to_cbor()),
        "malformed": seal_snapshot(snapshot_key(snap.parent), SNAPSHOT_DOMAIN, cursor, cursor_hash,
                                   malformed.to_cbor()),
    }
    reasons = []
    for name, bad in cases.items():
        snap.write_bytes(bad)
        try:
            view = ChainView.resume(transport, snap, lab.params)
            view.sync()
        except Exception as exc:
            return False, "chain", f"the {name} snapshot made the follower raise {type(exc).__name__}"
        if view.discarded is None:
            return False, "chain", f"the {name} snapshot was trusted"
        if view.state.to_cbor() != honest.state.to_cbor() or view.cursor != honest.cursor:
            return False, "chain", f"after the {name} snapshot the follower derived another state"
        reasons.append(f"{name}: {view.discarded.split('snapshot: ')[-1][:60]}")
    return (
        True,
        "chain",
        "each refused and derived again from genesis to the same bytes; " + "; ".join(reasons),
    )
