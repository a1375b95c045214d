"""The miner's run directory: kept states every K steps, every leaf (append-only), run metadata.

A deleted state is regenerated exactly by replaying from the nearest kept state before it (exact
arithmetic makes the bytes identical); each regenerated state is checked against its leaf.
Layout: meta.cbor, leaves.bin (b"POTL1\\n" then [u16 length | leaf bytes] records),
states/<t:08d>.safetensors, openings/<hex digest>.opening.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from commitments import cbor
from commitments.errors import CommitmentError
from commitments.files import atomic_write_bytes
from commitments.leaves import StepLeaf, parse_step_leaf
from oracle.state import StateError, TrainState
from oracle.step import step as oracle_step

LEAVES_MAGIC = b"POTL1\n"
META_VERSION = "pot/run-dir/v1"
_STATE_RE = re.compile(r"^(\d{8})\.safetensors$")


class CheckpointError(CommitmentError):
    """A run directory that cannot be used or a state that cannot be regenerated, with the reason."""


def _read_leaves(path: Path) -> tuple[list[bytes], list[StepLeaf], int]:
    """(leaf bytes, parsed leaves, bytes of whole records) of a leaves file; a partial tail is ignored."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the leaves: {exc.strerror or exc}") from None
    if not data.startswith(LEAVES_MAGIC):
        raise CheckpointError(f"{path}: not a leaves file (bad magic)")
    raws: list[bytes] = []
    parsed: list[StepLeaf] = []
    pos, end = len(LEAVES_MAGIC), len(data)
    while pos + 2 <= end:
        (n,) = struct.unpack(">H", data[pos:pos + 2])
        if pos + 2 + n > end:
            break
        raw = data[pos + 2:pos + 2 + n]
        try:
            leaf = parse_step_leaf(raw)
        except CommitmentError as exc:
            raise CheckpointError(f"{path}: record {len(raws)} is not a step leaf: {exc}") from None
        if leaf.t != len(raws):
            raise CheckpointError(f"{path}: record {len(raws)} is the leaf of step {leaf.t}")
        raws.append(raw)
        parsed.append(leaf)
        pos += 2 + n
    return raws, parsed, pos


def read_run_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run metadata of a directory (None when it has none yet)."""
    p = Path(run_dir) / "meta.cbor"
    if not p.exists():
        return None
    try:
        obj = cbor.decode(p.read_bytes())
    except (CommitmentError, OSError) as exc:
        raise CheckpointError(f"{p}: unreadable run metadata: {exc}") from None
    if not isinstance(obj, dict) or obj.get("version") != META_VERSION:
        raise CheckpointError(f"{p}: not {META_VERSION} run metadata")
    return obj


def read_leaves(run_dir: str | os.PathLike[str]) -> list[bytes]:
    """The leaves of a run directory, read only (a reader never repairs a file a trainer appends to)."""
    return _read_leaves(Path(run_dir) / "leaves.bin")[0]


class CheckpointStore:
    """One run directory. `spec`, `dataset` and `batch_fn` are needed only to regenerate states.

    `batch_fn(t)` returns the token batch step t was trained on (the schedule's batch, or what a
    fault-injected run actually used), so regeneration reproduces exactly what was committed.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, keep_every: int = 10, spec: Any = None,
                 batch_fn: Callable[[int], Any] | None = None) -> None:
        if not isinstance(keep_every, int) or isinstance(keep_every, bool) or keep_every < 1:
            raise CheckpointError(f"keep_every must be a positive int, got {keep_every!r}")
        self.dir = Path(run_dir)
        self.keep_every = keep_every
        self.spec = spec
        self.batch_fn = batch_fn
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "states").mkdir(exist_ok=True)
        (self.dir / "openings").mkdir(exist_ok=True)
        self._leaves: list[bytes] = []
        self._parsed: list[StepLeaf] = []
        self._cache: tuple[int, Any] | None = None  # last regenerated state: sequential reads stay O(n)
        self._load_leaves()

    # --- metadata -------------------------------------------------------------------------
    @property
    def meta_path(self) -> Path:
        return self.dir / "meta.cbor"

    def read_meta(self) -> dict[str, Any] | None:
        return read_run_meta(self.dir)

    def write_meta(self, meta: dict[str, Any]) -> None:
        atomic_write_bytes(self.meta_path, cbor.encode({**meta, "version": META_VERSION}))

    # --- leaves ---------------------------------------------------------------------------
    @property
    def leaves_path(self) -> Path:
        return self.dir / "leaves.bin"

    def _load_leaves(self) -> None:
        p = self.leaves_path
        if not p.exists():
            atomic_write_bytes(p, LEAVES_MAGIC)
            return
        self._leaves, self._parsed, valid = _read_leaves(p)
        if valid < p.stat().st_size:
            # A crash mid-append leaves a partial record; it was never acknowledged, so cut it.
            with open(p, "r+b") as f:
                f.truncate(valid)
                f.flush()
                os.fsync(f.fileno())

    def append_leaf(self, leaf: bytes) -> StepLeaf:
        """Durably append the leaf of the next step (leaf 0 first)."""
        parsed = parse_step_leaf(leaf)
        if parsed.t != len(self._leaves):
            raise CheckpointError(
                f"the next leaf is step {len(self._leaves)}, got the leaf of step {parsed.t}"
            )
        with open(self.leaves_path, "ab") as f:
            f.write(struct.pack(">H", len(leaf)) + leaf)
            f.flush()
            os.fsync(f.fileno())
        self._leaves.append(bytes(leaf))
        self._parsed.append(parsed)
        return parsed

    @property
    def leaves(self) -> list[bytes]:
        return list(self._leaves)

    @property
    def parsed_leaves(self) -> list[StepLeaf]:
        return list(self._parsed)

    def losses(self) -> list[float]:
        """Committed losses of steps 1..n-1."""
        return [x.loss for x in self._parsed[1:]]

    def __len__(self) -> int:
        return len(self._leaves)

    # --- states ---------------------------------------------------------------------------
    def state_path(self, t: int) -> Path:
        return self.dir / "states" / f"{t:08d}.safetensors"

    def kept_steps(self) -> list[int]:
        out = []
        for p in (self.dir / "states").iterdir():
            m = _STATE_RE.match(p.name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def should_keep(self, t: int, final: int | None = None) -> bool:
        return t == 0 or t % self.keep_every == 0 or (final is not None and t == final)

    def save_state(self, state: Any) -> Path:
        """Write the state after step state.step atomically."""
        path = self.state_path(state.step)
        state.to_safetensors(path)
        return path

    def prune(self, *, keep: Sequence[int] = ()) -> list[int]:
        """Delete kept states that are not every K-th step (nor 0, the last, or `keep`)."""
        kept = self.kept_steps()
        last = kept[-1] if kept else None
        gone = []
        for t in kept:
            if t == 0 or t == last or t % self.keep_every == 0 or t in keep:
                continue
            self.state_path(t).unlink(missing_ok=True)
            gone.append(t)
        return gone

    def _load(self, t: int) -> Any:
        try:
            return TrainState.from_safetensors(self.state_path(t), self.spec)
        except StateError as exc:
            raise CheckpointError(str(exc)) from None

    def _check(self, t: int, state: Any, how: str) -> None:
        if t < len(self._parsed) and state.digest() != self._parsed[t].state_digest:
            raise CheckpointError(f"the {how} state after step {t} does not match leaf {t}'s state digest")

    def state(self, t: int, *, progress: bool = False) -> Any:
        """The state after step t: read if kept, else regenerated from the nearest kept state."""
        if self.spec is None:
            raise CheckpointError("this store was opened without a spec; it cannot read states")
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < max(len(self._leaves), 1):
            raise CheckpointError(f"step {t!r} has no leaf in this run (0..{len(self._leaves) - 1})")
        if self.state_path(t).exists():
            st = self._load(t)
            self._check(t, st, "kept")
            return st
        return self._regenerate(t, progress=progress)

    def _regenerate(self, t: int, *, progress: bool) -> Any:
        if self.batch_fn is None:
            raise CheckpointError(
                f"state {t} is not kept and this store has no batch source to regenerate it"
            )
        base = max((k for k in self.kept_steps() if k < t), default=None)
        start, st = None, None
        if self._cache is not None and self._cache[0] < t and (base is None or self._cache[0] >= base):
            start, st = self._cache
        elif base is not None:
            start, st = base, self._load(base)
            self._check(base, st, "kept")
        if st is None:
            raise CheckpointError(f"no kept state before step {t} to regenerate it from")
        steps: Iterator[int] = iter(range(start + 1, t + 1))
        if progress:
            steps = iter(tqdm(list(steps), desc=f"regenerate state {t}", unit="step", file=sys.stderr))
        for k in steps:
            st, _ = oracle_step(st, self.batch_fn(k), self.spec, k)
            self._check(k, st, "regenerated")
            self._cache = (k, st)
        return st

    # --- openings -------------------------------------------------------------------------
    def opening_path(self, digest: bytes) -> Path:
        return self.dir / "openings" / f"{bytes(digest).hex()}.opening"

    def put_opening(self, digest: bytes, data: bytes) -> Path:
        path = self.opening_path(digest)
        atomic_write_bytes(path, data)
        return path


__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "LEAVES_MAGIC",
    "META_VERSION",
    "read_leaves",
    "read_run_meta",
]
