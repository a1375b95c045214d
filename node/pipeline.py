"""The work of one challenge, stage by stage, without the database: fetch, validate, loss checks,
replay (in a separate process), witness value. The daemon persists each stage's result.

A stage that refuses the opening names a refusal class; the witness value of a refusal is the
consensus rule in challenges.refused.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from challenges.refused import fetch_refusal_class
from commitments.files import atomic_write_bytes
from node.stages import Stage


@dataclass(frozen=True)
class ChainFacts:
    """What the chain says about a challenge's run: validate_opening's keyword arguments."""

    expected_digest: bytes
    run_id: bytes
    step: int
    spec_digest: bytes
    dataset_hash: bytes
    schedule_commitment: bytes
    initial_hash: bytes
    root: bytes
    size: int

    def kwargs(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class StageOutcome:
    """One stage's result: ok, or a refusal (class + reason); with its start and end times."""

    stage: Stage
    started_at: float
    finished_at: float = 0.0
    ok: bool = True
    refusal_class: str | None = None
    reason: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


def stage_fetch(
    *,
    uri: str,
    endpoint: str,
    run_id: bytes,
    dest: Path,
    leaves_dest: Path | None,
    max_opening_bytes: int,
    max_leaves_bytes: int,
    policy,
    stop=None,
    facts: ChainFacts | None = None,
    store=None,
    manifest_only: bool = False,
    mirrors: tuple[str, ...] = (),
    owner: str | None = None,
) -> StageOutcome:
    """Download the opening to `dest` and the run's leaf list to `leaves_dest` (best effort; None: not).

    The opening is tried at `uri`, then at each of `mirrors` in order, each address with the
    whole fetch policy (its timeouts, retries and backoff); the bytes are bound by the opening
    digest on chain, so any address that serves them will do. data "url" names the one that did
    and data "tried" the failures before it. With the chain's `facts`, the opening's manifest is
    checked against the opening digest and the spec digest as soon as it arrives, and the file
    may be no larger than its spec allows (nor than `max_opening_bytes`). Every download failure
    is the one class "unavailable"; the detail (kind and reason) goes to the node's own log and
    database. A full openings `store` (node.fetch.OpeningsStore) raises OpeningsFull: the node's
    condition, never a refusal. `manifest_only` (with `facts`; a node whose replays run on a
    cluster) stops the download once the manifest passed those checks and keeps no file: data
    "bytes" is then the opening's exact size and data "spec" its spec.

    `owner` ("miner:<account>") is whose download this is: its name lookups run on that miner's
    resolver slots (node.egress.ResolverSlots). A `store` of one miner (OpeningsStore.for_miner)
    holds the downloads to that miner's share. A failure where every address failed for a reason
    that may pass (a lookup or connection timeout, a refused connection, HTTP 5xx) sets data
    "retryable": the daemon tries again while the window has room before it reveals the refusal.
    """
    from node.fetch import MinerShare

    if owner:
        policy = replace(policy, owner=owner)
    try:
        return _fetch_stage(
            uri=uri,
            endpoint=endpoint,
            run_id=run_id,
            dest=dest,
            leaves_dest=leaves_dest,
            max_opening_bytes=max_opening_bytes,
            max_leaves_bytes=max_leaves_bytes,
            policy=policy,
            stop=stop,
            facts=facts,
            store=store,
            manifest_only=manifest_only,
            mirrors=mirrors,
        )
    finally:
        if isinstance(store, MinerShare):
            store.release()  # the files count as they are from now on


def _fetch_stage(*, uri: str, endpoint: str, run_id: bytes, dest: Path, leaves_dest: Path | None,
                 max_opening_bytes: int, max_leaves_bytes: int, policy, stop, facts: ChainFacts | None, store,
                 manifest_only: bool, mirrors: tuple[str, ...]) -> StageOutcome:
    from challenges.opening import OpeningGate, OpeningRefused
    from node.fetch import FetchError, fetch_to_file, resolve_uri

    out = StageOutcome(Stage.FETCH, time.time())
    if store is not None:
        store.room(0)  # a full openings disk stops new downloads before any connection
    room = None if store is None else store.room_for(dest)
    addresses = [uri, *mirrors]
    part = dest.with_name(dest.name + ".part")
    tried: list[str] = []
    refusal: tuple[str, str] | None = None  # (class, reason) of an address that served a refused opening
    served = False
    passing = True  # every failure so far may pass if tried again later
    for i, address in enumerate(addresses):
        if i > 0:
            part.unlink(missing_ok=True)  # another server: its bytes are not resumed onto the last one's
        gate = None if facts is None else OpeningGate(expected_digest=facts.expected_digest,
                                                      spec_digest=facts.spec_digest)
        size_of = _manifest_only(gate) if manifest_only and gate is not None else gate
        where = address
        try:
            url = where = resolve_uri(address, endpoint)
            out.data["url"] = url
            out.data["bytes"] = fetch_to_file(
                url, dest, max_bytes=max_opening_bytes, policy=policy, stop=stop, size_of=size_of, room=room
            )
        except _ManifestRead as read:
            out.data["bytes"], out.data["spec"] = read.size, gate.spec  # type: ignore[union-attr]
        except FetchError as exc:
            passing = passing and exc.retryable
            tried.append(
                f"{where[:300]}: {exc.kind}: {exc.reason}"
                if len(addresses) > 1
                else f"{exc.kind}: {exc.reason}"
            )
            continue
        except OpeningRefused as exc:
            passing = False
            klass = exc.refusal_class or "malformed"
            reason = f"too_large: {exc.reason}" if klass == "unavailable" else exc.reason
            refusal = refusal or (klass, reason)
            tried.append(f"{where[:300]}: {reason}" if len(addresses) > 1 else reason)
            continue
        served = True
        break
    if tried:
        out.data["tried"] = tried
    if not served:
        out.ok = False
        out.refusal_class = refusal[0] if refusal is not None else fetch_refusal_class("unreachable")
        out.reason = "; ".join(tried)[:4000]
        out.data["retryable"] = passing and refusal is None
        out.finished_at = time.time()
        return out
    if manifest_only:
        dest.unlink(
            missing_ok=True
        )  # a file too short to hold its manifest: the worker's validation refuses it
        out.data.setdefault("spec", None)
    if leaves_dest is not None:
        fetch_leaves(out, run_id=run_id, endpoint=endpoint, dest=leaves_dest, max_bytes=max_leaves_bytes,
                     policy=policy, store=store)
    out.finished_at = time.time()
    return out


class _ManifestRead(Exception):  # noqa: N818 - the end of a manifest-only download, not an error
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _manifest_only(gate):
    def size_of(prefix: bytes) -> tuple[bool, int]:
        done, n = gate(prefix)
        if done:
            raise _ManifestRead(n)
        return done, n
    return size_of


def fetch_leaves(out: StageOutcome, *, run_id: bytes, endpoint: str, dest: Path, max_bytes: int, policy,
                 store=None) -> None:
    """The run's leaf list into `dest`. It only feeds the secondary checks: its absence is a
    finding (out.data["leaves_error"]), not a refusal."""
    from node.fetch import FetchError, OpeningsFull, fetch_bytes, resolve_uri

    try:
        leaves_url = resolve_uri(f"runs/{run_id.hex()}/leaves", endpoint)
        data = fetch_bytes(leaves_url, max_bytes=max_bytes, policy=policy)
        if store is not None:
            store.room_for(dest)(len(data))
        atomic_write_bytes(dest, data)
        out.data["leaves_bytes"] = len(data)
    except FetchError as exc:
        out.data["leaves_error"] = f"{exc.kind}: {exc.reason}"
    except OpeningsFull as exc:
        out.data["leaves_error"] = str(exc)


def warm_up() -> float:
    """Import what the validate stage runs on (torch, the oracle's state layout and its compiled
    kernels: seconds, and tens of seconds on a busy machine) and return the seconds it took.
    Without it the first challenge's validation paid for the imports, and its time read as ~5 s
    for an opening it checks in milliseconds."""
    started = time.monotonic()
    import challenges.opening  # noqa: F401
    import commitments.tensors  # noqa: F401
    import oracle.state  # noqa: F401  (torch, oracle.models, oracle.exact)

    return time.monotonic() - started


def start_warm_up(done=None) -> threading.Thread:
    """`warm_up` on a thread of its own (the daemon follows the chain meanwhile); `done(seconds)`
    is called when it finishes."""
    def body() -> None:
        seconds = warm_up()
        if done is not None:
            done(seconds)

    t = threading.Thread(target=body, name="pot-warm-up", daemon=True)
    t.start()
    return t


def stage_validate(path: Path, facts: ChainFacts, *, max_bytes: int) -> StageOutcome:
    """load_opening + validate_opening: every cheap check before any compute."""
    from challenges.opening import OpeningRefused, load_opening, validate_opening

    out = StageOutcome(Stage.VALIDATE, time.time())
    try:
        opening = load_opening(path, max_bytes=max_bytes)
    except OpeningRefused as exc:
        out.ok, out.refusal_class, out.reason = False, "malformed", exc.reason
    else:
        try:
            # Nothing of the state is kept (the replay worker reads the file again): hash and
            # check it in place, in the file's map, rather than copying gigabytes out of it.
            validate_opening(opening, **facts.kwargs(), copy_state=False)
        except OpeningRefused as exc:
            out.ok, out.refusal_class, out.reason = False, "invalid", exc.reason
    out.finished_at = time.time()
    return out


def stage_losschecks(leaves_path: Path, *, root: bytes, size: int, config) -> StageOutcome:
    """Verify the served leaves against the root, then run the loss checks on their losses."""
    from challenges.losschecks import run_loss_checks
    from challenges.opening import LeavesRefused, committed_losses, verify_leaves

    out = StageOutcome(Stage.LOSSCHECKS, time.time())
    if not leaves_path.exists():
        out.data = {"ok": False, "error": "the prover did not serve the run's leaves", "findings": []}
    else:
        try:
            leaves = verify_leaves(leaves_path.read_bytes(), root, size)
            losses = committed_losses(leaves)
            # The losses are kept with the report: the dashboard draws the run's loss curve from them.
            out.data = {**run_loss_checks(losses, config).to_dict(), "losses": losses}
        except LeavesRefused as exc:
            out.data = {"ok": False, "error": exc.reason, "findings": []}
    out.finished_at = time.time()
    return out


# --- replay in separate processes ----------------------------------------------------------------


def replay_file(
    path: str, facts: dict[str, Any], max_bytes: int, challenge_id: bytes | None = None
) -> dict[str, Any]:
    """Validate again (objects do not cross processes) and replay; a picklable message. With
    `challenge_id` the result carries the witness pair's proof hash of the post-state."""
    from challenges.replay import verify_opening_file

    started, cpu = time.time(), time.process_time()
    ok, reason, result = verify_opening_file(path, max_bytes=max_bytes, challenge_id=challenge_id, **facts)
    return {"ok": True, "matches": ok, "reason": reason, "started_at": started, "finished_at": time.time(),
            "cpu_s": time.process_time() - cpu,
            "result": None if result is None else {
                "leaf": result.leaf, "state_digest": result.state_digest, "loss_bits": result.loss_bits,
                "value_hash": result.value_hash, "norm_bucket": result.norm_bucket,
                "proof_hash": result.proof_hash}}


def _worker_main(conn, threads: int) -> None:
    """A warm replay worker: imports the oracle once, then replays one job at a time."""
    import signal as _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # the parent decides when workers stop
    import torch

    torch.set_num_threads(max(1, threads))
    import challenges.replay  # noqa: F401  (warm the imports before the first job)

    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            msg = replay_file(*job)
        except BaseException as exc:  # the parent needs a reason, whatever went wrong
            msg = {
                "ok": False,
                "reason": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc()[-4000:],
            }
        try:
            conn.send(msg)
        except (BrokenPipeError, OSError):
            return


class _Worker:
    def __init__(self, ctx, threads: int) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, threads), daemon=True, name="pot-replay")
        self.proc.start()
        child.close()
        self.key: bytes | None = None
        self.started = 0.0
        self.timeout_s = 0.0

    def kill(self, wait_s: float = 5.0) -> None:
        """SIGKILL, then reap the process for up to `wait_s` (an unreaped one is gone all the same)."""
        self.proc.kill()
        self.proc.join(wait_s)
        self.conn.close()


class ReplayPool:
    """Up to `workers` replay processes (spawned on first need, then kept warm with the oracle
    imported); a hung or dead one is killed and replaced."""

    def __init__(self, workers: int, timeout_s: float, *, threads_per_worker: int = 1) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self.threads = threads_per_worker
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []

    def free(self) -> int:
        return self.workers - sum(w.key is not None for w in self._workers)

    def running(self, key: bytes) -> bool:
        return any(w.key == key for w in self._workers)

    def start(self, key: bytes, path: Path, facts: ChainFacts, *, max_bytes: int,
              timeout_s: float | None = None, remote=None) -> None:
        """Replay on a free worker; past `timeout_s` (at most the pool's) the worker is killed.
        `key` is the challenge id: the replay's proof hash is keyed by it. (`remote`: what a
        cluster backend needs to fetch the opening itself; the pool reads `path`.)"""
        worker = next((w for w in self._workers if w.key is None), None)
        if worker is None:
            if len(self._workers) >= self.workers:
                raise RuntimeError("no free replay worker")
            worker = _Worker(self._ctx, self.threads)
            self._workers.append(worker)
        worker.conn.send((str(path), facts.kwargs(), max_bytes, bytes(key)))
        worker.key, worker.started = key, time.monotonic()
        worker.timeout_s = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)

    def poll(self) -> list[tuple[bytes, dict[str, Any]]]:
        """Finished (or failed, or timed-out) replays: [(key, message)]."""
        done = []
        for i, w in enumerate(self._workers):
            if w.key is None:
                if not w.proc.is_alive():
                    self._workers[i] = _Worker(self._ctx, self.threads)
                continue
            msg = None
            replace = False
            if w.conn.poll():
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    msg, replace = (
                        {"ok": False, "reason": f"replay worker died (exit code {w.proc.exitcode})"},
                        True,
                    )
            elif not w.proc.is_alive():
                msg, replace = (
                    {"ok": False, "reason": f"replay worker died (exit code {w.proc.exitcode})"},
                    True,
                )
            elif time.monotonic() - w.started > w.timeout_s:
                msg, replace = {"ok": False, "timeout": True,
                                "reason": f"replay took longer than its budget of {w.timeout_s:.1f} s"}, True
            if msg is None:
                continue
            done.append((w.key, msg))
            w.key = None
            if replace:
                w.kill()
                self._workers[i] = _Worker(self._ctx, self.threads)
        return done

    def shutdown(self, grace_s: float = 0.5) -> None:
        """Stop every worker within about `grace_s`: a replay is redone after a restart, so a busy
        worker is killed at once; an idle one is asked to exit and killed if it has not within
        `grace_s` (a worker still importing the oracle reads its pipe only once that is done)."""
        until = time.monotonic() + grace_s
        for w in self._workers:
            if w.key is not None:
                w.proc.kill()
            elif w.proc.is_alive():
                try:
                    w.conn.send(None)
                except (BrokenPipeError, OSError):
                    w.proc.kill()
        for w in self._workers:
            w.proc.join(max(0.0, until - time.monotonic()))
            if w.proc.is_alive():
                w.kill(0.5)
            else:
                w.conn.close()
        self._workers = []


__all__ = ["ChainFacts", "ReplayPool", "StageOutcome", "stage_fetch", "stage_losschecks", "stage_validate",
           "start_warm_up", "warm_up"]
