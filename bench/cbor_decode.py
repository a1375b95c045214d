"""Decode speed of the strict CBOR decoder against the one it replaced (cbor2.loads, a walk over
the result, then a re-encode compared with the input), on a typical opening manifest and on a
leaf list, side by side in one process. Prints MB/s for each and the ratio; never pass/fail.

    .venv/bin/python bench/cbor_decode.py [--leaves 100000] [--batch 32] [--seq-len 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cbor2  # noqa: E402 - after the path set-up, like the project imports

from challenges.opening import OPENING_VERSION, encode_leaves  # noqa: E402
from commitments import cbor  # noqa: E402
from commitments.errors import MalformedCBOR, NonCanonicalCBOR  # noqa: E402
from commitments.leaves import step_leaf  # noqa: E402
from commitments.spec import Spec  # noqa: E402


def previous_decode(data: bytes) -> Any:
    """The decoder as it was: parse with cbor2, check the types, re-encode and compare."""

    def check(obj: Any, depth: int = 0) -> None:
        if depth > cbor.MAX_DEPTH:
            raise MalformedCBOR("too deep")
        if obj is None or isinstance(obj, (bool, int, float, bytes, str)):
            return
        if isinstance(obj, list):
            for x in obj:
                check(x, depth + 1)
            return
        if isinstance(obj, dict):
            for k, v in obj.items():
                check(k, depth + 1)
                check(v, depth + 1)
            return
        raise MalformedCBOR("type")

    obj = cbor2.loads(data)
    check(obj)
    if cbor.encode(obj) != data:
        raise NonCanonicalCBOR("not canonical")
    return obj


def manifest(batch: int, seq_len: int, depth: int) -> bytes:
    """An opening manifest with the fields build_opening writes, at a realistic size."""
    rnd = os.urandom
    spec = Spec.from_dict({"steps": 1 << depth, "model": {"kind": "gpt", "block_size": seq_len, "n_layer": 2,
                                                          "n_head": 2, "n_embd": 64},
                           "batch": {"batch_size": batch, "seq_len": seq_len},
                           "rng": {"seed": 7, "schedule_seed": 11}})
    proof = lambda: [rnd(32) for _ in range(depth)]  # noqa: E731
    return cbor.encode({
        "version": OPENING_VERSION, "run_id": rnd(32), "step": 12345, "spec": spec.to_cbor(),
        "pre_state_blob": rnd(32), "pre_state_len": 1 << 24, "token_dtype": "uint16",
        "samples": [[i * 7919, rnd(2 * (seq_len + 1)), proof()] for i in range(batch)],
        "num_samples": 1 << 22, "dataset_hash": rnd(32), "schedule_proof": proof(),
        "schedule_commitment": rnd(32), "steps": 1 << depth,
        "leaf_prev": step_leaf(12344, rnd(32), 0x3F800000), "leaf_prev_proof": proof(),
        "leaf": step_leaf(12345, rnd(32), 0x3F7FF000), "leaf_proof": proof(),
        "root": rnd(32), "size": 1 << depth,
    })


def leaf_list(n: int) -> bytes:
    return encode_leaves([step_leaf(t, os.urandom(32), 0x3F800000 - t if t else 0) for t in range(n)])


def best_of(fn, data: bytes, seconds: float) -> float:
    """Best time of one call, repeating for about `seconds`."""
    best, spent = float("inf"), 0.0
    while spent < seconds or best == float("inf"):
        t0 = time.perf_counter()
        fn(data)
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leaves", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=2.0, help="time spent per measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    docs = {
        "opening manifest": manifest(args.batch, args.seq_len, depth=20),
        "leaf list": leaf_list(args.leaves),
    }
    rows = []
    for name, data in docs.items():
        assert cbor.decode(data) == previous_decode(data)
        old, new = best_of(previous_decode, data, args.seconds), best_of(cbor.decode, data, args.seconds)
        rows.append(
            {
                "document": name,
                "bytes": len(data),
                "old_ms": old * 1e3,
                "new_ms": new * 1e3,
                "old_mb_s": len(data) / old / 1e6,
                "new_mb_s": len(data) / new / 1e6,
                "speedup": old / new,
            }
        )
    print(
        f"{'document':<18}{'bytes':>11}{'old ms':>10}{'new ms':>10}"
        f"{'old MB/s':>10}{'new MB/s':>10}{'new/old':>9}"
    )
    for r in rows:
        print(f"{r['document']:<18}{r['bytes']:>11}{r['old_ms']:>10.2f}{r['new_ms']:>10.2f}"
              f"{r['old_mb_s']:>10.1f}{r['new_mb_s']:>10.1f}{r['speedup']:>8.2f}x")
    print("old: cbor2.loads + type walk + re-encode and compare; new: commitments.cbor.decode (one pass)")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
