"""Speed of commitments.vrf (ECVRF-EDWARDS25519-SHA512-TAI): prove and verify per call, the median
of N calls each on fresh keys and inputs, in wall time and in this thread's CPU time, and what
share of one core a node spends verifying a number of assignments every block at the protocol's
default block time (ProtocolParams.block_seconds). All figures come from one run; never
pass/fail.

    .venv/bin/python bench/vrf.py [--calls 400] [--per-block 1000] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nacl.bindings import crypto_core_ed25519_add, crypto_scalarmult_ed25519_noclamp  # noqa: E402

from chain.protocol.params import ProtocolParams  # noqa: E402 - after the path set-up
from commitments import vrf  # noqa: E402


def _medians(calls: list[Callable[[], object]]) -> tuple[float, float]:
    """Median wall and CPU seconds of one call (each call timed on its own)."""
    wall: list[float] = []
    cpu: list[float] = []
    for call in calls:
        w0, c0 = time.perf_counter(), time.thread_time()
        call()
        c1, w1 = time.thread_time(), time.perf_counter()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
    return statistics.median(wall), statistics.median(cpu)


def _batch_cpu(calls: list[Callable[[], object]]) -> float:
    """CPU seconds per call over the whole batch (thread_time's tick is coarse for one call)."""
    c0 = time.thread_time()
    for call in calls:
        call()
    return (time.thread_time() - c0) / len(calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="calls timed for each of prove and verify")
    parser.add_argument("--per-block", type=int, default=1000, help="verifies a node makes every block")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.per_block < 1:
        parser.error("--calls and --per-block must be at least 1")

    block_seconds = ProtocolParams().block_seconds
    keys = [vrf.keygen(hashlib.sha256(b"bench key %d" % i).digest()) for i in range(args.calls)]
    alphas = [hashlib.sha256(b"bench alpha %d" % i).digest() for i in range(args.calls)]
    proofs = [vrf.prove(k, a) for k, a in zip(keys, alphas, strict=True)]
    prove_calls: list[Callable[[], object]] = [
        (lambda k=k, a=a: vrf.prove(k, a)) for k, a in zip(keys, alphas, strict=True)
    ]
    verify_calls: list[Callable[[], object]] = [
        (lambda k=k, a=a, p=p: vrf.verify(k.public_key, a, p))
        for k, a, p in zip(keys, alphas, proofs, strict=True)
    ]
    _batch_cpu(verify_calls[: min(20, args.calls)])  # warm-up
    prove_wall, _ = _medians(prove_calls)
    verify_wall, _ = _medians(verify_calls)
    prove_cpu = _batch_cpu(prove_calls)
    verify_cpu = _batch_cpu(verify_calls)
    # The floor: verify makes three of libsodium's variable-base multiplications (c*Y, s*H,
    # c*Gamma), each of which also checks its point's subgroup.
    mult_calls: list[Callable[[], object]] = [
        (lambda p=p: crypto_scalarmult_ed25519_noclamp(p[48:], p[:32])) for p in proofs
    ]
    mult_cpu = _batch_cpu(mult_calls)
    # A hostile input: key and Gamma moved out of the prime-order subgroup (plus the point of
    # order 2), which libsodium will not multiply; verify does all its work, then refuses.
    order_2 = (vrf.P - 1).to_bytes(32, "little")

    def hostile(k: vrf.SecretKey, a: bytes, p: bytes) -> Callable[[], object]:
        y, gamma = crypto_core_ed25519_add(k.public_key, order_2), crypto_core_ed25519_add(p[:32], order_2)

        def call() -> None:
            try:
                vrf.verify(y, a, gamma + p[32:])
            except vrf.VRFProofInvalid:
                return
            raise AssertionError("a proof with moved points verified")

        return call

    hostile_cpu = _batch_cpu([hostile(k, a, p) for k, a, p in zip(keys, alphas, proofs, strict=True)])
    share = args.per_block * verify_cpu / block_seconds
    share_wall = args.per_block * verify_wall / block_seconds
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    result = {
        "calls": args.calls,
        "prove_us_median_wall": round(prove_wall * 1e6, 1),
        "prove_us_cpu": round(prove_cpu * 1e6, 1),
        "verify_us_median_wall": round(verify_wall * 1e6, 1),
        "verify_us_cpu": round(verify_cpu * 1e6, 1),
        "verify_over_prove_cpu": round(verify_cpu / prove_cpu, 2),
        "libsodium_mult_us_cpu": round(mult_cpu * 1e6, 1),
        "verify_over_mult_cpu": round(verify_cpu / mult_cpu, 2),
        "hostile_verify_us_cpu": round(hostile_cpu * 1e6, 1),
        "hostile_over_verify_cpu": round(hostile_cpu / verify_cpu, 2),
        "per_block": args.per_block,
        "block_seconds": block_seconds,
        "core_share_cpu": round(share, 4),
        "core_share_wall": round(share_wall, 4),
        "loadavg_1min": round(load, 2),
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"ECVRF-EDWARDS25519-SHA512-TAI, {args.calls} calls each (load average {load:.2f} "
          f"on {os.cpu_count()} CPUs)")
    print(f"  prove : {prove_wall * 1e6:8.1f} us median wall, {prove_cpu * 1e6:8.1f} us CPU per call")
    print(f"  verify: {verify_wall * 1e6:8.1f} us median wall, {verify_cpu * 1e6:8.1f} us CPU per call "
          f"({verify_cpu / prove_cpu:.2f} x prove)")
    print(f"  libsodium variable-base multiplication: {mult_cpu * 1e6:.1f} us CPU; verify is "
          f"{verify_cpu / mult_cpu:.2f} of them (three are its floor)")
    print(f"  verify of a key and Gamma outside the prime-order subgroup (refused): "
          f"{hostile_cpu * 1e6:.1f} us CPU ({hostile_cpu / verify_cpu:.2f} x an honest verify)")
    print(f"  {args.per_block} verifies a block at {block_seconds} s blocks: {share:.2%} of one core "
          f"(CPU time; {share_wall:.2%} by median wall time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
