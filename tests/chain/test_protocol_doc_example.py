"""The worked example of docs/protocol.md ("A worked example"), recomputed from the code.

Every hex value (and every drawn step, seat and integer) the example prints is computed here and
must appear in docs/protocol.md verbatim, so the document cannot drift from the protocol. Run the
module as a script to print the values in the form the document shows them:

    PYTHONPATH=$PWD .venv/bin/python tests/chain/test_protocol_doc_example.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chain.calls import StartTrainingCommitment, derive_run_id, encode_call
from chain.protocol.cost import opening_blocks, replay_cost, run_escrow
from chain.protocol.params import ProtocolParams
from chain.protocol.state import registration_digest
from challenges.derive import (
    COMMITTEE_DOMAIN,
    STEP_DOMAIN,
    challenge_id,
    challenge_step_at,
    dispute_seats,
    draw_committee,
    rechallenge_id,
    seat_units,
)
from challenges.refused import refused_value_hash
from challenges.witness import proof_key, state_proof, witness_commitment
from commitments import cbor, merkle
from commitments.hashing import digest, structure_bytes
from commitments.leaves import loss_bits, step_leaf, witness_value_hash
from commitments.spec import Spec
from commitments.tensors import keyed_tensor_digests, state_digest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
SPEC = ROOT / "examples" / "specs" / "gpt-demo.toml"

# The example's fixed inputs (the document states each one).
ORIGIN = "alice"  # a dev-chain account
SS58_ORIGIN = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"  # //Alice, SS58 prefix 42
NONCE = bytes(range(16))
SCHEDULE = bytes([0x22]) * 32
DATASET = bytes([0x33]) * 32
ENDPOINT = "http://miner.example:8000"
BLOCK = bytes([0xB1]) * 32  # the hash of the block that issues challenge 0
RESOLVE_BLOCK = bytes([0xB2]) * 32  # the hash of the block that resolves its first round
VERIFIERS = [("bob", 300), ("carol", 550), ("dave", 1200)]  # free bonds; verifier_stake is 100
SEATS = 5
DISPUTE_CAP = 7  # the dispute lottery shown as if MAX_DISPUTE_SEATS were 7
SALT = bytes(range(0x40, 0x60))
WITNESS = "carol"


def toy_state(t: int) -> list[tuple[str, np.ndarray]]:
    """The post-state of step t of the example: one two-element parameter, its AdamW moments,
    the step counter and the seed, in the oracle's canonical order."""
    return [
        ("param/w", np.array([0.25 * t, -1.0], dtype=np.float32)),
        ("opt/exp_avg/w", np.array([0.125 * t, 0.0], dtype=np.float32)),
        ("opt/exp_avg_sq/w", np.array([0.0625 * t, 0.5], dtype=np.float32)),
        ("step", np.array(t, dtype=np.int64)),
        ("rng/seed", np.array(1337, dtype=np.uint64)),
    ]


def toy_leaf(t: int) -> bytes:
    bits = 0 if t == 0 else loss_bits(np.float32(2.5 - t / 8))
    return step_leaf(t, state_digest(toy_state(t)), bits)


def wrap(hexstr: str, width: int = 64) -> str:
    """Hex cut into lines of `width` characters, as the document prints long values."""
    return "\n".join(hexstr[i : i + width] for i in range(0, len(hexstr), width))


def example() -> dict[str, str]:
    """label -> the exact text the document shows for it."""
    spec = Spec.from_toml(SPEC)
    steps = spec.steps
    out: dict[str, str] = {}
    out["spec digest"] = spec.digest().hex()
    out["run id preimage"] = structure_bytes("pot/run-id/v2", ORIGIN, NONCE).hex()
    run_id = derive_run_id(ORIGIN, NONCE)
    out["run id"] = run_id.hex()
    out["run id (ss58)"] = derive_run_id(SS58_ORIGIN, NONCE).hex()

    leaves = [toy_leaf(t) for t in range(steps + 1)]
    call = StartTrainingCommitment(
        run_id=run_id, nonce=NONCE, initial_hash=state_digest(toy_state(0)), schedule_commitment=SCHEDULE,
        dataset_hash=DATASET, spec=spec.to_cbor(), declared_steps=steps, endpoint=ENDPOINT,
    )
    out["initial hash"] = call.initial_hash.hex()
    wire = encode_call(call)
    out["registration size"] = f"{len(wire)} bytes"
    out["registration wire"] = wrap(wire.hex())
    out["registration digest"] = registration_digest(cbor.encode(call.to_wire())).hex()
    params = ProtocolParams()
    blocks = replay_cost(spec, params).blocks
    out["replay blocks"] = f"replay_blocks = {blocks}"
    fee, escrow = run_escrow(blocks, params)
    out["escrow"] = (f"opening_blocks = {opening_blocks(spec, params, call.checkpoint_interval)}, "
                     f"seat_fee = {fee}, escrow = {escrow}")

    size = steps + 1
    root = merkle.root(leaves)
    out["root"] = root.hex()
    first_draw = structure_bytes(STEP_DOMAIN, BLOCK, run_id, root, size, 0, 0)
    out["step draw preimage"] = wrap(first_draw.hex())
    d = digest(STEP_DOMAIN, BLOCK, run_id, root, size, 0, 0)
    out["step draw digest"] = d.hex()
    x = int.from_bytes(d[:8], "big")
    step = challenge_step_at(BLOCK, run_id, root, size, 0)
    assert x < (1 << 64) - ((1 << 64) % steps) and step == 1 + x % steps  # the first draw is accepted
    out["step draw"] = f"x = {x}, step = 1 + x mod {steps} = {step}"
    cid = challenge_id(run_id, root, size, 0, BLOCK)
    out["challenge id"] = cid.hex()
    out["rechallenge id"] = rechallenge_id(cid, 2, RESOLVE_BLOCK).hex()

    seed = BLOCK + cid
    units = seat_units(VERIFIERS, params.verifier_stake)
    out["units"] = "units = " + ", ".join(f"{a} {k}" for a, k in units)
    total = sum(k for _, k in units)
    draws = []
    for j in range(SEATS):
        counter = 0
        while True:
            v = int.from_bytes(digest(COMMITTEE_DOMAIN, seed, j, counter)[:8], "big")
            counter += 1
            if v < (1 << 64) - ((1 << 64) % (total - j)):
                break
        draws.append(f"{v % (total - j)} of {total - j}")
    committee = draw_committee(BLOCK, cid, units, SEATS)
    out["committee digest 0"] = digest(COMMITTEE_DOMAIN, seed, 0, 0).hex()
    out["committee draws"] = "x = " + ", ".join(draws)
    out["committee"] = "committee = [" + ", ".join(committee) + "]"
    out["dispute seats"] = (
        "dispute seats = [" + ", ".join(dispute_seats(BLOCK, cid, units, DISPUTE_CAP)) + "]"
    )

    post = toy_state(step)
    key = proof_key(cid)
    out["proof key"] = key.hex()
    for name, kd in keyed_tensor_digests(post, key):
        out[f"keyed {name}"] = f"{name:<17} {kd.hex()}"
    proof = state_proof(cid, post)
    out["state proof"] = proof.hex()
    value = witness_value_hash(leaves[step])
    out["leaf t"] = leaves[step].hex()
    out["merkle leaf hash"] = merkle.leaf_hash(leaves[step]).hex()
    out["value hash"] = value.hex()
    out["commitment"] = witness_commitment(cid, value, 0, SALT, WITNESS, proof_hash=proof).hex()
    out["refused value"] = refused_value_hash(cid).hex()
    out["params digest"] = params.digest().hex()
    out["params record"] = wrap(params.to_cbor().hex())
    return out


def replay_rows() -> list[str]:
    """The rows of the document's replay-cost table: every spec of examples/specs under the
    default parameters."""
    params = ProtocolParams()
    rows = []
    for path in sorted((ROOT / "examples" / "specs").glob("*.toml")):
        spec = Spec.from_toml(path)
        c = replay_cost(spec, params)
        rows.append(f"| `{path.name}` | {spec.model.kind} | {spec.batch.batch_size} x {spec.batch.seq_len} | "
                    f"{c.params:,} | {c.flops:,} | {c.bytes:,} | {float(c.seconds):.3f} | {c.blocks} | "
                    f"{max(params.commit_window, c.blocks)} |")
    return rows


def test_every_value_of_the_worked_example_is_in_the_document():
    doc = DOC.read_text(encoding="utf-8")
    missing = [label for label, text in example().items() if text not in doc]
    assert not missing, f"docs/protocol.md does not show these values of its worked example: {missing}"


def test_the_replay_cost_table_is_the_code_s():
    doc = DOC.read_text(encoding="utf-8")
    missing = [row for row in replay_rows() if row not in doc]
    assert not missing, f"docs/protocol.md's replay-cost table lacks or misstates: {missing}"


def test_the_example_follows_the_protocol_rules():
    """The example's committee is one the protocol would draw: 20 seat units against five seats,
    drawn without replacement, each account holding at most its units; a 2-seat first round is the
    draw's first two seats; the dispute lottery gives exactly the floors plus the lottery's seats."""
    spec = Spec.from_toml(SPEC)
    run_id = derive_run_id(ORIGIN, NONCE)
    root = merkle.root([toy_leaf(t) for t in range(spec.steps + 1)])
    cid = challenge_id(run_id, root, spec.steps + 1, 0, BLOCK)
    units = seat_units(VERIFIERS, ProtocolParams().verifier_stake)
    committee = draw_committee(BLOCK, cid, units, SEATS)
    assert draw_committee(BLOCK, cid, units, 2) == committee[:2]
    assert all(committee.count(a) <= k for a, k in units)
    seats = dispute_seats(BLOCK, cid, units, DISPUTE_CAP)
    total = sum(k for _, k in units)
    assert len(seats) == DISPUTE_CAP
    assert all(k * DISPUTE_CAP // total <= seats.count(a) <= k * DISPUTE_CAP // total + 1 for a, k in units)


if __name__ == "__main__":
    for label, text in example().items():
        print(f"--- {label}\n{text}")
    print("--- replay table")
    print("\n".join(replay_rows()))
