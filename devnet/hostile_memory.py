"""Hostile-input probes, second round: decoder memory amplification (leaf lists, manifests).
Registered in devnet.hostile.

Each payload is 8 MiB of containers that cost tens of bytes of Python objects per byte; a real
prover serves it and the node's own fetch and decoding run on it under tracemalloc, whose peak
must stay within 4x the payload."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

from challenges.losschecks import LossCheckConfig
from challenges.opening import MAGIC
from commitments import cbor
from devnet.forge import max_opening_bytes
from devnet.hostile import _head, _honest_facts, fetch_policy, probe
from devnet.lab import Lab, Prover
from node.config import NodeConfig
from node.pipeline import stage_fetch, stage_losschecks

KIND = "an amplification payload"
PAYLOAD_BYTES = 8 << 20
MAX_RATIO = 4.0


def _traced(fn: Callable[[], Any]) -> tuple[Any, int]:
    """fn()'s result and the peak of traced memory above what was traced when it started."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was:
            tracemalloc.stop()


def empty_arrays(n: int = PAYLOAD_BYTES) -> bytes:
    """An array of n - 5 empty arrays: n bytes, 64 bytes of objects each to a naive decoder."""
    count = n - 5
    return _head(4, count) + b"\x80" * count


def triples_of_empty_arrays(n: int) -> bytes:
    """An array of [[], [], []]: each array head is cheap, so only a budget by bytes stops it."""
    count = (n - 9) // 4
    return _head(4, count) + b"\x83\x80\x80\x80" * count


def _serve_and_run(lab: Lab, tag: str, opening: bytes, leaves: bytes | None) -> tuple[Any, Any, int]:
    """stage_fetch (with the run's leaf list when given) from a fresh prover, then the loss-check
    stage on what it fetched, as the node runs them: (fetch outcome, loss-check outcome, peak)."""
    prover = Prover()
    try:
        uri = prover.put(f"/openings/{tag}", opening)
        if leaves is not None:
            prover.put(f"/runs/{lab.honest.run_id.hex()}/leaves", leaves)
        facts = _honest_facts(lab)
        dest = lab.dir / "verifier" / f"{tag}.opening"
        dest.parent.mkdir(parents=True, exist_ok=True)
        leaves_dest = dest.with_suffix(".leaves")
        leaves_dest.unlink(missing_ok=True)

        def path() -> tuple[Any, Any]:
            out = stage_fetch(uri=uri, endpoint=prover.endpoint, run_id=lab.honest.run_id, dest=dest,
                              leaves_dest=leaves_dest if leaves is not None else None,
                              max_opening_bytes=max(max_opening_bytes(lab), len(opening) + 1),
                              max_leaves_bytes=NodeConfig().fetch.max_leaves_bytes,
                              policy=fetch_policy(loopback_allowed=True), facts=facts)
            checks = None
            if out.ok and leaves is not None:
                checks = stage_losschecks(
                    leaves_dest, root=facts.root, size=facts.size, config=LossCheckConfig()
                )
            return out, checks

        (out, checks), peak = _traced(path)
        return out, checks, peak
    finally:
        prover.close()


@probe(
    "leaf-list-of-empty-arrays",
    KIND,
    "refuse a served leaf list of 8 MiB of empty arrays, its fetch and decoding peaking within 4x the "
    "payload",
)
def _leaf_list(lab: Lab) -> tuple[bool, str, str]:
    payload = empty_arrays()
    out, checks, peak = _serve_and_run(lab, "amplified-leaves", lab.opening(), payload)
    if not out.ok:
        return (
            False,
            "fetch",
            f"the honest opening beside the leaf list was refused: [{out.refusal_class}] {out.reason}",
        )
    if out.data.get("leaves_bytes") != len(payload):
        return False, "fetch", f"the leaf list was not fetched whole: {out.data.get('leaves_error')}"
    ratio = peak / len(payload)
    if checks is None or checks.data.get("ok") or not checks.data.get("error"):
        return False, "losschecks", f"the leaf list was not refused (traced peak {ratio:.2f}x)"
    if ratio > MAX_RATIO:
        return False, "losschecks", (f"refused ({checks.data['error'][:60]}), but the fetch and decoding "
                                     f"peaked at {ratio:.1f}x the {len(payload)} bytes")
    return (
        True,
        "losschecks",
        f"{checks.data['error'][:90]}; traced peak {ratio:.2f}x of {len(payload)} bytes",
    )


@probe("manifest-of-empty-arrays", KIND,
       "refuse at the fetch an opening whose 8 MiB manifest is arrays of empty arrays, the download and its "
       "decoding peaking within 4x the payload")
def _manifest(lab: Lab) -> tuple[bool, str, str]:
    results = []
    for shape, body in (
        ("flat", empty_arrays(PAYLOAD_BYTES - 20)),
        ("triples", triples_of_empty_arrays(PAYLOAD_BYTES - 20)),
    ):
        manifest = b"\xa1" + cbor.encode("samples") + body
        opening = MAGIC + struct.pack(">I", len(manifest)) + manifest
        out, _, peak = _serve_and_run(lab, f"amplified-manifest-{shape}", opening, None)
        ratio = peak / len(opening)
        if out.ok:
            return False, "fetch", f"the {shape} manifest was fetched (traced peak {ratio:.2f}x)"
        if ratio > MAX_RATIO:
            return False, "fetch", (f"[{out.refusal_class}] {out.reason[:60]}, but the download and decoding "
                                    f"peaked at {ratio:.1f}x the {len(opening)} bytes")
        results.append((shape, out, ratio))
    return (
        True,
        "fetch",
        "; ".join(f"{s}: [{o.refusal_class}] {o.reason[-60:]}, peak {r:.2f}x" for s, o, r in results),
    )
