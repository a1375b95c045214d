"""Replays on a Ray cluster (`[replay] backend = "ray"`): the node keeps the chain, the database,
the journal, the commits and the reveals; cluster workers fetch the opening from its URI under the
node's egress and size rules, validate it, replay the step and send back the witness and timings.

The node reads only an opening's manifest (stage_peek: checked against the chain, a few kB) to
size each task's CPU and memory request from the spec. A task past its stage budget is cancelled
(its worker process is killed); a task whose worker or node dies is run again by Ray, on another
node when its node is gone, while its budget lasts. Ray is the `pot-verifier[cluster]` extra: it
is imported only when this backend is configured.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from node.pipeline import ChainFacts, StageOutcome, replay_file, stage_fetch, stage_validate

MIB = 1 << 20
# What a replay worker holds besides the step's tensors: the interpreter, torch, numba.
BASE_MEMORY = 512 * MIB


class ClusterError(RuntimeError):
    """The cluster cannot be used (Ray missing, the head unreachable), with the reason."""


# --- sizing --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """One replay task's request: logical CPUs (also its torch threads) and bytes of memory."""

    cpus: int
    memory: int


def replay_resources(spec: Any, opening_bytes: int) -> Resources:
    """A replay's request from its spec: the opening on disk, the pre-state and the new state, the
    per-sequence float64 gradient partials of the batch (exact-v1 folds them per sequence: batch
    size times 8 bytes per parameter), the rounded gradients, the activations, plus the
    interpreter. CPUs: the
    hardware class's thread count for torch-native (its bytes depend on it); else one per 25M
    parameters, from 1 to 8."""
    from challenges.opening import state_size_bound
    from oracle.state import param_specs

    params = sum(math.prod(p.shape) for p in param_specs(spec))
    state = state_size_bound(spec)
    m = spec.model
    width = getattr(m, "n_embd", None) or max(getattr(m, "hidden", None) or (64,))
    # activations kept for the backward pass, in float64 partials: ~96 values per layer and
    # feature and 3 per vocabulary entry, per token (GPT-2 small at 1 x 256: 2.1 GB)
    tokens = spec.batch.batch_size * spec.batch.seq_len
    acts = tokens * ((getattr(m, "n_layer", None) or 1) * width * 96 + 3 * m.vocab_size) * 8
    memory = BASE_MEMORY + opening_bytes + 3 * state + spec.batch.batch_size * params * 8 + params * 4 + acts
    if spec.profile == "torch-native" and spec.hardware is not None:
        cpus = spec.hardware.threads
    else:
        cpus = min(8, max(1, math.ceil(params / 25_000_000)))
    return Resources(cpus, -(-memory // MIB) * MIB)


def fallback_resources(opening_bytes: int) -> Resources:
    """The request when the spec is not at hand (the node restarted between fetch and replay):
    sized from the opening, whose size the spec bounds."""
    return Resources(1, -(-(BASE_MEMORY + 6 * max(0, opening_bytes)) // MIB) * MIB)


# --- on a cluster worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteOpening:
    """What a worker needs to fetch the opening itself (the daemon passes it to ReplayPool.start
    as `remote`): where it is, the node's fetch rules and the task's resource request."""

    uri: str
    endpoint: str
    policy: Any  # node.fetch.FetchPolicy: the node's egress allow-list, timeouts and retries
    resources: Resources
    mirrors: tuple[str, ...] = ()  # further addresses of the same bytes, tried in order after `uri`


def cluster_replay(
    uri: str,
    endpoint: str,
    facts: dict[str, Any],
    max_bytes: int,
    policy,
    deadline: float,
    threads: int,
    challenge_id: bytes | None = None,
    mirrors: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One challenge on a worker: fetch (from `uri`, then each of `mirrors`, under the node's
    egress and size rules, stopped at `deadline`, a wall-clock time), validate, replay. The
    message ReplayPool.poll gives (the proof hash keyed by `challenge_id` included), plus
    "timings", "worker" and "url" (the address that served it); a refused opening gives
    "refusal_class" and "reason" and no result."""
    import torch

    torch.set_num_threads(max(1, threads))
    chain = ChainFacts(**facts)
    work = Path(tempfile.mkdtemp(prefix="pot-replay-"))
    started = time.time()
    where = f"{socket.gethostname()}:{os.getpid()}"
    left = max(0.1, deadline - started)
    policy = replace(
        policy,
        connect_timeout_s=min(policy.connect_timeout_s, left),
        read_timeout_s=min(policy.read_timeout_s, left),
        total_timeout_s=min(policy.total_timeout_s, left),
    )
    try:
        from node.fetch import FetchStopped

        path = work / "opening"
        try:
            fetched = stage_fetch(
                uri=uri,
                endpoint=endpoint,
                run_id=chain.run_id,
                dest=path,
                leaves_dest=None,
                max_opening_bytes=max_bytes,
                max_leaves_bytes=0,
                policy=policy,
                stop=lambda: time.time() > deadline,
                facts=chain,
                mirrors=tuple(mirrors),
            )
        except FetchStopped:
            return {"ok": False, "timeout": True, "worker": where,
                    "reason": "the opening did not arrive on the worker before the replay's deadline"}
        timings = {"fetch_s": round(fetched.finished_at - fetched.started_at, 3)}
        if not fetched.ok:
            return _refused(fetched, started, timings, where)
        validated = stage_validate(path, chain, max_bytes=max_bytes)
        timings["validate_s"] = round(validated.finished_at - validated.started_at, 3)
        if not validated.ok:
            return _refused(validated, started, timings, where)
        msg = replay_file(str(path), facts, max_bytes, challenge_id)
        timings["replay_s"] = round(msg["finished_at"] - msg["started_at"], 3)
        return {**msg, "started_at": started, "timings": timings, "worker": where,
                "bytes": fetched.data.get("bytes"), "url": fetched.data.get("url")}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _refused(o: StageOutcome, started: float, timings: dict[str, float], where: str) -> dict[str, Any]:
    return {
        "ok": True,
        "matches": False,
        "result": None,
        "refusal_class": o.refusal_class,
        "reason": o.reason,
        "refused_at": str(o.stage),
        "started_at": started,
        "finished_at": time.time(),
        "timings": timings,
        "worker": where,
    }


# --- on the node -----------------------------------------------------------------------------------


@dataclass
class _Task:
    ref: Any
    started: float
    timeout_s: float


class ClusterReplays:
    """ReplayPool's interface over Ray tasks: at most `workers` challenges in flight on the cluster."""

    def __init__(self, address: str, workers: int, timeout_s: float, *, max_retries: int = 3,
                 namespace: str = "pot-verifier") -> None:
        try:
            import ray
        except ImportError:
            raise ClusterError(
                '[replay] backend = "ray" needs Ray: pip install "pot-verifier[cluster]"'
            ) from None
        self._ray = ray
        self.workers = workers
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False, configure_logging=False,
                     ignore_reinit_error=True)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, ...
            raise ClusterError(
                f"cannot join the Ray cluster at {address!r}: {type(exc).__name__}: {exc}"
            ) from None
        self._fn = ray.remote(cluster_replay)
        self._tasks: dict[bytes, _Task] = {}

    def free(self) -> int:
        return self.workers - len(self._tasks)

    def running(self, key: bytes) -> bool:
        return key in self._tasks

    def start(self, key: bytes, path: Path, facts: ChainFacts, *, max_bytes: int,
              timeout_s: float | None = None, remote: RemoteOpening | None = None) -> None:
        """Submit the challenge; its worker fetches the opening from `remote.uri` (not `path`)."""
        if remote is None:
            raise ClusterError("a cluster replay needs the opening's URI and the fetch rules")
        if len(self._tasks) >= self.workers:
            raise RuntimeError("no free replay slot on the cluster")
        budget = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        res = remote.resources
        ref = self._fn.options(
            num_cpus=res.cpus,
            memory=res.memory,
            max_retries=self.max_retries,
            retry_exceptions=False,
            name=f"pot-replay-{key.hex()[:16]}",
        ).remote(
            remote.uri,
            remote.endpoint,
            facts.kwargs(),
            max_bytes,
            remote.policy,
            time.time() + budget,
            res.cpus,
            bytes(key),
            tuple(remote.mirrors),
        )
        self._tasks[key] = _Task(ref, time.monotonic(), budget)

    def poll(self) -> list[tuple[bytes, dict[str, Any]]]:
        """Finished, failed or cancelled tasks: [(key, message)] as ReplayPool.poll gives them."""
        if not self._tasks:
            return []
        ray = self._ray
        refs = {t.ref: k for k, t in self._tasks.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0, fetch_local=True)
        done = []
        for ref in ready:
            key = refs[ref]
            try:
                msg = ray.get(ref, timeout=30)
            except ray.exceptions.TaskCancelledError:
                msg = {"ok": False, "timeout": True, "reason": "the cluster task was cancelled"}
            except ray.exceptions.RayError as exc:
                # a worker or node lost more often than max_retries, out of memory, or a bug
                msg = {"ok": False, "reason": f"cluster task failed: {type(exc).__name__}: {str(exc)[:1500]}"}
            del self._tasks[key]
            done.append((key, msg))
        now = time.monotonic()
        for key, task in list(self._tasks.items()):
            if now - task.started > task.timeout_s:
                ray.cancel(task.ref, force=True)  # kills the worker process running it, wherever it is
                del self._tasks[key]
                done.append((key, {"ok": False, "timeout": True,
                                   "reason": f"replay took longer than its budget of {task.timeout_s:.1f} s "
                                             f"(cluster task cancelled)"}))
        return done

    def shutdown(self) -> None:
        for task in self._tasks.values():
            try:
                self._ray.cancel(task.ref, force=True)
            except Exception:  # noqa: BLE001 - shutting down: the cluster may already be gone
                pass
        self._tasks = {}
        self._ray.shutdown()


__all__ = [
    "ClusterError",
    "ClusterReplays",
    "RemoteOpening",
    "Resources",
    "cluster_replay",
    "fallback_resources",
    "replay_resources",
]
