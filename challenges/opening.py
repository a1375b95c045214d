"""Openings of a challenged step: one file = magic, u32 manifest length, CBOR manifest, pre-state.

The miner builds it (`build_opening`); verifiers load it (`load_opening`, refusing anything
malformed) and check it against the chain's facts before any compute (`validate_opening`).

Container (big-endian length):

    b"POTO1\\n" | u32 len(manifest) | manifest (canonical CBOR map) | pre-state (safetensors bytes)

Manifest fields (exactly these, no others):

    version            "pot/opening/v1"
    run_id             32 bytes
    step               t >= 1, the challenged step
    spec               the spec's canonical CBOR (Spec.to_cbor())
    pre_state_blob     BLAKE3 of the safetensors bytes that follow the manifest
    pre_state_len      their length
    token_dtype        dtype name of the samples' tokens ("uint16" or "uint32")
    samples            [[index, little-endian token bytes, dataset proof], ...] in batch order
    num_samples        number of samples in the dataset (the dataset tree's size)
    dataset_hash       the dataset's Merkle root
    schedule_proof     inclusion proof of batch t (leaf index t-1) under schedule_commitment
    schedule_commitment, steps   the schedule's root and length
    leaf_prev, leaf_prev_proof   leaf t-1 and its inclusion proof (index t-1)
    leaf, leaf_proof             leaf t and its inclusion proof (index t)
    root, size                   the checkpoint tree both proofs are for

Opening digest = digest("pot/opening/v1", manifest); the manifest binds the pre-state through
its blob digest and length, so the digest covers the whole file.
"""

from __future__ import annotations

import hmac
import mmap
import os
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commitments import cbor, merkle
from commitments.dataset import ALLOWED_DTYPES, verify_sample
from commitments.errors import CommitmentError
from commitments.hashing import DIGEST_SIZE, digest, h
from commitments.leaves import StepLeaf, parse_step_leaf
from commitments.schedule import verify_batch
from commitments.spec import Spec

OPENING_VERSION = "pot/opening/v1"
MAGIC = b"POTO1\n"
_HEADER = len(MAGIC) + 4
# A manifest holds B samples with their proofs and two leaf proofs: megabytes at the very most.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
# The pre-state of a GPT-2-small AdamW run is ~1.5 GB; callers lower this to their own budget.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024 * 1024
MAX_PROOF_LEN = merkle.MAX_PROOF_LEN
MAX_LEAVES_BYTES = 512 * 1024 * 1024

FIELDS = (
    "version", "run_id", "step", "spec", "pre_state_blob", "pre_state_len", "token_dtype", "samples",
    "num_samples", "dataset_hash", "schedule_proof", "schedule_commitment", "steps",
    "leaf_prev", "leaf_prev_proof", "leaf", "leaf_proof", "root", "size",
)


class OpeningRefused(ValueError):
    """An opening that is malformed or does not match the chain, with the reason (and, where the
    refusing code knows it, the refusal class: "malformed", "invalid" or "unavailable")."""

    def __init__(self, reason: str, refusal_class: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refusal_class = refusal_class


class LeavesRefused(OpeningRefused):
    """A served leaf list that is malformed or does not recompute the committed root."""


# --- the opening as data ----------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    index: int
    tokens: bytes  # little-endian, `Opening.token_dtype`
    proof: tuple[bytes, ...]


@dataclass(frozen=True)
class Opening:
    """A loaded, well-formed opening (nothing checked against the chain yet)."""

    manifest: dict[str, Any]
    manifest_bytes: bytes
    pre_state: bytes | memoryview  # a memoryview of the file's map when loaded from a path
    digest: bytes

    @property
    def run_id(self) -> bytes:
        return self.manifest["run_id"]

    @property
    def step(self) -> int:
        return self.manifest["step"]

    @property
    def spec_bytes(self) -> bytes:
        return self.manifest["spec"]

    @property
    def token_dtype(self) -> str:
        return self.manifest["token_dtype"]

    @property
    def samples(self) -> list[Sample]:
        return [Sample(i, tok, tuple(p)) for i, tok, p in self.manifest["samples"]]

    @property
    def indices(self) -> list[int]:
        return [s[0] for s in self.manifest["samples"]]

    @property
    def leaf(self) -> bytes:
        return self.manifest["leaf"]

    @property
    def leaf_proof(self) -> list[bytes]:
        return list(self.manifest["leaf_proof"])

    @property
    def leaf_prev(self) -> bytes:
        return self.manifest["leaf_prev"]

    @property
    def root(self) -> bytes:
        return self.manifest["root"]

    @property
    def size(self) -> int:
        return self.manifest["size"]

    def __getattr__(self, name: str) -> Any:
        # Every other manifest field reads as an attribute too (opening.dataset_hash, ...).
        manifest = self.__dict__.get("manifest")
        if manifest is not None and name in manifest:
            return manifest[name]
        raise AttributeError(f"Opening has no attribute {name!r}")


@dataclass(frozen=True)
class ValidatedOpening:
    """An opening that passed every check of `validate_opening`; ready to replay."""

    opening: Opening
    spec: Spec
    state: Any  # oracle.state.TrainState, the pre-state (after step t-1)
    batch: Any  # torch.int64 tensor [batch_size, seq_len + 1]
    leaf_prev: StepLeaf
    leaf_t: StepLeaf

    @property
    def step(self) -> int:
        return self.opening.step

    @property
    def run_id(self) -> bytes:
        return self.opening.run_id

    @property
    def digest(self) -> bytes:
        return self.opening.digest

    @property
    def leaf_bytes(self) -> bytes:
        return self.opening.leaf


# --- digests and encoding ---------------------------------------------------------------------


def manifest_digest(manifest: dict[str, Any]) -> bytes:
    return digest(OPENING_VERSION, manifest)


def opening_digest(data: bytes | bytearray | memoryview | Opening) -> bytes:
    """The digest of an opening file's bytes (or of a loaded Opening)."""
    if isinstance(data, Opening):
        return data.digest
    return load_opening(data).digest


def encode_opening(manifest: dict[str, Any], pre_state: bytes) -> bytes:
    """The container bytes for a manifest and its pre-state (the manifest is encoded canonically)."""
    mb = cbor.encode(manifest)
    if len(mb) > MAX_MANIFEST_BYTES:
        raise OpeningRefused(f"manifest of {len(mb)} bytes exceeds the limit of {MAX_MANIFEST_BYTES}")
    return MAGIC + struct.pack(">I", len(mb)) + mb + bytes(pre_state)


def state_bytes(state: Any) -> bytes:
    """The safetensors bytes of a TrainState, tensors in canonical order (what openings carry)."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in state.tensors.items()}
    # One metadata key only: safetensors writes the metadata map in hash order, so two keys would
    # give two byte layouts (two opening digests) for one state. The order is the spec's layout.
    return save(tensors, metadata={"format": "pot/state/v1"})


def build_opening(*, spec: Spec, run_id: bytes, step: int, pre_state: Any, dataset: Any, schedule: Any,
                  leaves: Sequence[bytes], size: int | None = None, root: bytes | None = None) -> bytes:
    """The opening file of step `step` (miner side).

    `pre_state` is the state after step-1 (a TrainState, or its safetensors bytes); `leaves` are
    the run's leaf bytes 0.. (at least `size` of them); the proofs are for the tree over the
    first `size` leaves (default all), whose root must equal `root` when given.
    """
    if not isinstance(run_id, (bytes, bytearray)) or len(run_id) != DIGEST_SIZE:
        raise OpeningRefused("run_id must be 32 bytes")
    size = len(leaves) if size is None else size
    if not isinstance(size, int) or not 2 <= size <= len(leaves):
        raise OpeningRefused(f"size {size!r} must be in 2..{len(leaves)} (the leaves held)")
    if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step < size:
        raise OpeningRefused(f"step {step!r} is outside 1..{size - 1} for a tree of {size} leaves")
    tree = merkle.MerkleTree.from_leaves(list(leaves[:size]))
    if root is not None and bytes(root) != tree.root():
        raise OpeningRefused(f"the leaves held do not give the root {bytes(root).hex()[:16]} at size {size}")
    blob = pre_state if isinstance(pre_state, (bytes, bytearray, memoryview)) else state_bytes(pre_state)
    blob = bytes(blob)
    indices = schedule.batch(step)
    dtype = dataset.tokens.dtype.name
    samples = []
    for i in indices:
        tok = np.ascontiguousarray(dataset.sample(int(i)), dtype=np.dtype(dtype).newbyteorder("<"))
        samples.append([int(i), tok.tobytes(), dataset.sample_proof(int(i))])
    manifest = {
        "version": OPENING_VERSION,
        "run_id": bytes(run_id),
        "step": step,
        "spec": spec.to_cbor(),
        "pre_state_blob": h(blob),
        "pre_state_len": len(blob),
        "token_dtype": dtype,
        "samples": samples,
        "num_samples": dataset.num_samples,
        "dataset_hash": dataset.dataset_hash,
        "schedule_proof": schedule.proof(step),
        "schedule_commitment": schedule.commitment,
        "steps": schedule.steps,
        "leaf_prev": bytes(leaves[step - 1]),
        "leaf_prev_proof": tree.inclusion_proof(step - 1),
        "leaf": bytes(leaves[step]),
        "leaf_proof": tree.inclusion_proof(step),
        "root": tree.root(),
        "size": size,
    }
    return encode_opening(manifest, blob)


# --- sizes from the spec, checked while the opening downloads ----------------------------------

# One served leaf (a step leaf's structure bytes) and the fixed manifest fields, generously.
_LEAF_BOUND = 512
_FIXED_MANIFEST_BOUND = 4096
_PROOF_BOUND = 9 + MAX_PROOF_LEN * (DIGEST_SIZE + 2)


def state_size_bound(spec: Spec) -> int:
    """The most bytes a pre-state under `spec` may take: its tensors' bytes, exactly, plus a
    bound on the safetensors header (names, dtypes, shapes, offsets, one short metadata map)."""
    from oracle.state import layout

    total = 8 + 1024
    for slot in layout(spec):
        n = 1
        for d in slot.shape:
            n *= d
        total += n * slot.dtype.itemsize + 2 * len(slot.name) + 160 + 21 * len(slot.shape)
    return total


def manifest_size_bound(spec: Spec, spec_len: int) -> int:
    """The most bytes a manifest under `spec` may take: the batch's tokens and dataset proofs,
    the schedule and leaf proofs, two leaves, the spec and the fixed fields."""
    per_sample = 3 * 9 + spec.sample_len * 4 + _PROOF_BOUND
    return (_FIXED_MANIFEST_BOUND + 9 + spec_len + spec.batch.batch_size * per_sample + 3 * _PROOF_BOUND
            + 2 * (9 + _LEAF_BOUND))


# The opening gate decodes the manifest inside the download's prefix, which stays in memory
# beside it: its objects may take 3x the manifest (plus the decoder's slack), so that the fetch's
# peak stays within 4x what it downloaded. An honest manifest is mostly 32-byte proof digests
# (88 bytes charged for 33 on the wire: 2.67x) and token bytes (about 1x): 2.0-2.8x measured.
# A spec of many short samples from a tiny dataset costs more per byte (up to about 16x): the
# decode may always take what an honest manifest of the run's spec costs (honest_manifest_charge),
# which the chain's spec bounds, so no memory limit ever refuses an honest opening.
GATE_MEMORY_RATIO = 3


def _decode_manifest(mb: bytes, start: int = 0, end: int | None = None, *,
                     ratio: int = cbor.MEMORY_RATIO, max_memory: int | None = None) -> dict[str, Any]:
    """The manifest in mb[start:end] (read in place), decoded within `ratio` times its size (or
    within `max_memory`)."""
    size = (len(mb) if end is None else end) - start
    budget = cbor.memory_budget(size, ratio) if max_memory is None else max_memory
    try:
        manifest = cbor.decode(mb, max_bytes=MAX_MANIFEST_BYTES, max_memory=budget, start=start, end=end)
    except CommitmentError as exc:
        raise OpeningRefused(f"the manifest is not canonical CBOR: {exc}", "malformed") from None
    _check_manifest(manifest)
    return manifest


def _manifest_spec(doc: bytes, lo: int, hi: int) -> bytes:
    """The spec bytes of the manifest doc[lo:hi], found without decoding the rest of it."""
    try:
        where = cbor.map_entry(doc, "spec", start=lo, end=hi)
        if where is None:
            raise OpeningRefused("manifest is missing field(s) spec", "malformed")
        value = cbor.decode(doc, max_bytes=MAX_MANIFEST_BYTES, start=where[0], end=where[1])
    except CommitmentError as exc:
        raise OpeningRefused(f"the manifest is not canonical CBOR: {exc}", "malformed") from None
    if not isinstance(value, bytes) or not value:
        raise OpeningRefused("manifest field spec must be non-empty bytes", "malformed")
    return value


def _proof_len(n: Any) -> int:
    """The most hashes an inclusion proof into a tree of `n` leaves holds (RFC 9162): ceil(log2 n)."""
    if not _is_uint(n) or n < 2:
        return 0
    return min((n - 1).bit_length(), MAX_PROOF_LEN)


def honest_manifest_charge(spec: Spec, spec_len: int, *, num_samples: Any = None, size: Any = None,
                           steps: Any = None) -> int:
    """The most the decoder charges for the objects of an honest manifest under `spec` whose
    dataset, checkpoint tree and schedule have `num_samples`, `size` and `steps` leaves (each
    proof at the depth its tree allows; an unknown size: MAX_PROOF_LEN), every other field at its
    largest, with a quarter more and the decoder's slack on top. A manifest's decode may always
    take this much, so a memory limit never refuses an honest opening whatever its spec's shape:
    many short samples from a tiny dataset cost up to about 16 times their bytes, where proofs
    and tokens cost 1 to 2.7 times theirs."""
    digest_ = cbor.charge_bytes(DIGEST_SIZE)

    def proof(n: Any) -> int:
        d = MAX_PROOF_LEN if n is None else _proof_len(n)
        return cbor.charge_array(d) + d * digest_

    sample = (
        cbor.charge_array(3) + cbor.CHARGE_INT + cbor.charge_bytes(4 * spec.sample_len) + proof(num_samples)
    )
    batch = spec.batch.batch_size
    keys = sum(cbor.charge_text(len(f)) for f in FIELDS)
    total = (cbor.charge_map(len(FIELDS)) + keys + len(FIELDS) * (cbor.CHARGE_INT + digest_)
             + cbor.charge_array(batch) + batch * sample + proof(steps) + 2 * proof(size)
             + 2 * cbor.charge_bytes(_LEAF_BOUND) + cbor.charge_bytes(spec_len) + cbor.charge_text(64))
    return total + total // 4 + cbor.MEMORY_SLACK


def _manifest_field(doc: bytes, lo: int, hi: int, name: str) -> Any:
    """One field of the manifest doc[lo:hi], decoded alone (None: the manifest has no such key)."""
    where = cbor.map_entry(doc, name, start=lo, end=hi)
    return (
        None
        if where is None
        else cbor.decode(doc, max_bytes=MAX_MANIFEST_BYTES, start=where[0], end=where[1])
    )


def _manifest_budget(doc: bytes, lo: int, hi: int, ratio: int, spec: Spec | None = None,
                     spec_len: int = 0) -> int:
    """The memory the decode of the manifest doc[lo:hi] may take: `ratio` times its size, or
    what an honest manifest of its own spec and tree sizes costs, whichever is more (never more
    than the decoder's cap). The spec and sizes are read alone first, building nothing else; a
    manifest whose fields cannot be read so gets the ratio, and its decode says what is wrong."""
    budget = cbor.memory_budget(hi - lo, ratio)
    try:
        if spec is None:
            raw = _manifest_field(doc, lo, hi, "spec")
            if not isinstance(raw, bytes):
                return budget
            spec, spec_len = Spec.from_cbor(raw), len(raw)
        sizes = {name: _manifest_field(doc, lo, hi, name) for name in ("num_samples", "size", "steps")}
    except CommitmentError:
        return budget
    honest = honest_manifest_charge(spec, spec_len, **sizes)
    return min(max(budget, honest), cbor.MAX_DECODE_MEMORY)


class OpeningGate:
    """A download's size gate (node.fetch's `size_of`): from the first bytes of an opening, the
    exact size the whole file must have. The manifest is checked against the opening digest on
    chain and its spec against the run's spec digest before a byte of the pre-state is taken,
    and the sizes it declares must fit that spec. Refusals carry their refusal class."""

    def __init__(self, *, expected_digest: bytes, spec_digest: bytes) -> None:
        self.expected_digest = bytes(expected_digest)
        self.spec_digest = bytes(spec_digest)
        self.spec: Spec | None = None

    def __call__(self, prefix: bytes) -> tuple[bool, int]:
        if len(prefix) < _HEADER:
            return False, _HEADER
        if prefix[:len(MAGIC)] != MAGIC:
            raise OpeningRefused(f"not an opening: the file does not start with {MAGIC!r}", "malformed")
        (mlen,) = struct.unpack(">I", prefix[len(MAGIC):_HEADER])
        if mlen > MAX_MANIFEST_BYTES:
            raise OpeningRefused(
                f"manifest length {mlen} exceeds the limit of {MAX_MANIFEST_BYTES}", "malformed"
            )
        if len(prefix) < _HEADER + mlen:
            return False, _HEADER + mlen
        doc = prefix if isinstance(prefix, bytes) else bytes(prefix[:_HEADER + mlen])
        lo, hi = _HEADER, _HEADER + mlen
        # The spec first, read in place without decoding the rest: it must be the run's, and it
        # sizes both the manifest and the memory its decode may take.
        spec_bytes = _manifest_spec(doc, lo, hi)
        try:
            spec = Spec.from_cbor(spec_bytes)
        except CommitmentError as exc:
            raise OpeningRefused(f"the opening's spec is not usable: {exc}", "invalid") from None
        if not _eq(spec.digest(), self.spec_digest):
            raise OpeningRefused(f"spec digest {_short(spec.digest())} != the run's spec digest "
                                 f"{_short(self.spec_digest)}", "invalid")
        bound = manifest_size_bound(spec, len(spec_bytes))
        if mlen > bound:
            raise OpeningRefused(
                f"the manifest is {mlen} bytes; its spec allows at most {bound}", "unavailable"
            )
        budget = _manifest_budget(doc, lo, hi, GATE_MEMORY_RATIO, spec, len(spec_bytes))
        manifest = _decode_manifest(doc, lo, hi, max_memory=budget)
        got = manifest_digest(manifest)
        if not _eq(got, self.expected_digest):
            raise OpeningRefused(f"opening digest {_short(got)} != the digest on chain "
                                 f"{_short(self.expected_digest)}", "invalid")
        bound = state_size_bound(spec)
        if manifest["pre_state_len"] > bound:
            raise OpeningRefused(f"the manifest declares a pre-state of {manifest['pre_state_len']} bytes; "
                                 f"its spec allows at most {bound}", "unavailable")
        self.spec = spec  # the checked spec, for a caller that sizes work from it
        return True, _HEADER + mlen + manifest["pre_state_len"]


# --- loading (shape only) ---------------------------------------------------------------------


def _read_limited(path: Path, max_bytes: int) -> bytes | memoryview:
    """The opening file's bytes, memory-mapped: pages are read as they are used and are the page
    cache's to drop, so a large pre-state costs no anonymous memory here."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise OpeningRefused(f"{path}: the opening is {size} bytes, over the limit of {max_bytes}")
            if size < _HEADER:
                return f.read(_HEADER)
            return memoryview(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ))
    except OSError as exc:
        raise OpeningRefused(f"{path}: cannot read the opening: {exc.strerror or exc}") from None


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _is_digest(v: Any) -> bool:
    return isinstance(v, bytes) and len(v) == DIGEST_SIZE


def _check_proof(name: str, v: Any) -> None:
    if not isinstance(v, list) or len(v) > MAX_PROOF_LEN or not all(_is_digest(p) for p in v):
        raise OpeningRefused(
            f"manifest field {name} must be a list of at most {MAX_PROOF_LEN} 32-byte hashes"
        )


def _check_manifest(m: Any) -> None:
    if not isinstance(m, dict):
        raise OpeningRefused(f"the manifest must be a CBOR map, got {type(m).__name__}")
    keys = set(m)
    if not all(isinstance(k, str) for k in keys):
        raise OpeningRefused("manifest keys must be text")
    missing, extra = [f for f in FIELDS if f not in keys], sorted(keys - set(FIELDS))
    if missing:
        raise OpeningRefused(f"manifest is missing field(s) {', '.join(missing)}")
    if extra:
        raise OpeningRefused(f"manifest has unknown field(s) {', '.join(extra)}")
    if m["version"] != OPENING_VERSION:
        raise OpeningRefused(f"manifest version must be {OPENING_VERSION!r}, got {m['version']!r}")
    for name in ("run_id", "pre_state_blob", "dataset_hash", "schedule_commitment", "root"):
        if not _is_digest(m[name]):
            raise OpeningRefused(f"manifest field {name} must be 32 bytes")
    for name in ("step", "pre_state_len", "num_samples", "steps", "size"):
        if not _is_uint(m[name]):
            raise OpeningRefused(f"manifest field {name} must be an unsigned integer, got {m[name]!r:.40}")
    if m["step"] < 1:
        raise OpeningRefused("manifest step must be at least 1 (leaf 0 is the initial state, not a step)")
    for name in ("spec", "leaf_prev", "leaf"):
        if not isinstance(m[name], bytes) or not m[name]:
            raise OpeningRefused(f"manifest field {name} must be non-empty bytes")
    if m["token_dtype"] not in ALLOWED_DTYPES:
        raise OpeningRefused(f"manifest token_dtype must be one of {', '.join(ALLOWED_DTYPES)}, "
                             f"got {m['token_dtype']!r:.40}")
    for name in ("schedule_proof", "leaf_prev_proof", "leaf_proof"):
        _check_proof(name, m[name])
    samples = m["samples"]
    if not isinstance(samples, list) or not samples:
        raise OpeningRefused("manifest samples must be a non-empty list")
    for k, s in enumerate(samples):
        if not (isinstance(s, list) and len(s) == 3):
            raise OpeningRefused(f"sample {k} must be [index, token bytes, proof]")
        if not _is_uint(s[0]):
            raise OpeningRefused(f"sample {k}: index must be an unsigned integer")
        if not isinstance(s[1], bytes):
            raise OpeningRefused(f"sample {k}: tokens must be bytes")
        _check_proof(f"samples[{k}] proof", s[2])


def load_opening(data_or_path: bytes | bytearray | memoryview | str | os.PathLike[str], *,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Opening:
    """Parse an opening file (bytes or a path); refuses anything malformed with `OpeningRefused`."""
    if isinstance(data_or_path, (str, os.PathLike)):
        data = _read_limited(Path(data_or_path), max_bytes)
    elif isinstance(data_or_path, (bytes, bytearray, memoryview)):
        data = bytes(data_or_path)
        if len(data) > max_bytes:
            raise OpeningRefused(f"the opening is {len(data)} bytes, over the limit of {max_bytes}")
    else:
        raise OpeningRefused(f"an opening is bytes or a path, got {type(data_or_path).__name__}")
    if len(data) < _HEADER:
        raise OpeningRefused(
            f"truncated opening: {len(data)} bytes is shorter than the {_HEADER}-byte header"
        )
    if data[:len(MAGIC)] != MAGIC:
        raise OpeningRefused(f"not an opening: the file does not start with {MAGIC!r}")
    (mlen,) = struct.unpack(">I", data[len(MAGIC):_HEADER])
    if mlen > MAX_MANIFEST_BYTES:
        raise OpeningRefused(f"manifest length {mlen} exceeds the limit of {MAX_MANIFEST_BYTES}")
    if _HEADER + mlen > len(data):
        raise OpeningRefused(f"truncated opening: the manifest needs {mlen} bytes, "
                             f"{len(data) - _HEADER} follow the header")
    mb = bytes(data[_HEADER:_HEADER + mlen])
    manifest = _decode_manifest(mb, max_memory=_manifest_budget(mb, 0, len(mb), cbor.MEMORY_RATIO))
    pre_state = data[_HEADER + mlen:]  # a view of the map when read from a file: no copy
    if len(pre_state) != manifest["pre_state_len"]:
        raise OpeningRefused(f"pre-state length is {len(pre_state)} bytes, the manifest says "
                             f"{manifest['pre_state_len']} (truncated or padded file)")
    return Opening(manifest, mb, pre_state, manifest_digest(manifest))


# --- validation against the chain (pure; no compute beyond hashing) -----------------------------


def _eq(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(bytes(a), bytes(b))


def _short(b: bytes) -> str:
    return bytes(b).hex()[:16]


# safetensors' own limit on the JSON header, and the dtypes a state may hold (the layout's).
_ST_MAX_HEADER = 100_000_000
_ST_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL")


def _torch_dtypes() -> dict[str, Any]:
    import torch

    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
            "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "BOOL": torch.bool}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k[:80]!r}")
        out[k] = v
    return out


def _span(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= max(d, 1)
        if n > 1 << 60:
            break
    return n


def _safetensors_index(buf: memoryview) -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]]:
    """The header of a safetensors buffer, checked as the format requires (little-endian u64 length,
    a JSON object, known dtypes, each tensor's bytes matching its shape, the tensors' byte ranges
    tiling the data exactly): (data start, {name: (dtype, shape, begin, end)}). ValueError if not."""
    import json

    if len(buf) < 8:
        raise ValueError(f"{len(buf)} bytes is shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > _ST_MAX_HEADER or 8 + n > len(buf):
        raise ValueError(f"header length {n} does not fit the {len(buf)}-byte buffer")
    raw = bytes(buf[8:8 + n])
    if not raw.startswith(b"{"):
        raise ValueError("the header is not a JSON object")
    header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise ValueError("__metadata__ must map text to text")
    index = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"tensor {name[:80]!r} must give exactly dtype, shape and data_offsets")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _ST_DTYPES:
            raise ValueError(f"tensor {name[:80]!r} has an unknown dtype")
        # Even an empty tensor's strides are products of its dims: past 2^60 elements torch
        # cannot describe it (and no state of ours comes near), so such a shape is refused here.
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape) or _span(shape) > 1 << 60:
            raise ValueError(f"tensor {name[:80]!r} has a bad shape")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(_is_uint(o) for o in offs)
            and offs[0] <= offs[1]
        ):
            raise ValueError(f"tensor {name[:80]!r} has bad data_offsets")
        index[name] = (dtype, tuple(shape), offs[0], offs[1])
    data_len = len(buf) - 8 - n
    at = 0
    types = _torch_dtypes()
    for name, (dtype, shape, begin, end) in sorted(index.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != at:
            raise ValueError(f"tensor {name[:80]!r} does not start where the previous one ends")
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * types[dtype].itemsize:
            raise ValueError(f"tensor {name[:80]!r}: {end - begin} bytes for shape {list(shape)[:8]}")
        at = end
    if at != data_len:
        raise ValueError(f"the tensors cover {at} of the {data_len} data bytes")
    return 8 + n, index


def parse_state_bytes(
    blob: bytes | memoryview, spec: Spec, *, where: str = "pre-state", copy: bool = True
) -> Any:
    """A TrainState from safetensors bytes, checked against the spec's layout; OpeningRefused if not.

    The buffer may be a memory map: the header and the layout are checked before any tensor is
    made (a header claiming huge shapes allocates nothing), and each tensor is copied out of the
    buffer once, so memory holds one state and no second copy of the file. With `copy=False` the
    tensors are read-only views of the buffer (of a map: page cache, no memory of the process's
    own), for a reader that only hashes and checks them; never write to them."""
    import torch

    from oracle.state import StateError, TrainState, check_tensors, layout

    types = _torch_dtypes()
    buf = memoryview(blob).cast("B")
    try:
        start, index = _safetensors_index(buf)
    except (ValueError, UnicodeDecodeError, struct.error, RecursionError) as exc:
        raise OpeningRefused(f"{where} is not a readable safetensors file ({exc})") from None
    try:
        # Meta tensors carry dtype and shape only: the layout is checked before a byte is copied.
        check_tensors(
            [(k, torch.empty(s, dtype=types[d], device="meta")) for k, (d, s, _, _) in index.items()],
            spec,
            where=where,
            ordered=False,
        )
        tensors = {}
        for slot in layout(spec):
            dtype, shape, begin, end = index[slot.name]
            if end > begin:
                with warnings.catch_warnings():  # a read-only buffer: the copy below is what we keep
                    warnings.simplefilter("ignore", UserWarning)
                    t = torch.frombuffer(
                        buf,
                        dtype=types[dtype],
                        count=(end - begin) // types[dtype].itemsize,
                        offset=start + begin,
                    )
            else:
                t = torch.empty(0, dtype=types[dtype])
            tensors[slot.name] = t.reshape(shape).clone() if copy else t.reshape(shape)
        state = TrainState(tensors)
        state.check(spec)
    except StateError as exc:
        raise OpeningRefused(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    return state


def _nonfinite(state: Any) -> str | None:
    import torch

    for name, t in state.tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            return f"{name} holds {bad} non-finite value(s)"
    return None


def _check_pretrained(state: Any, spec: Spec) -> None:
    """A fine-tune's state 0 is the committed pretrained parameters with zero moments."""
    import torch

    from oracle.importer import params_digest

    got = params_digest(state.params())
    if got.hex() != spec.init.params_digest:
        raise OpeningRefused(f"the initial state's parameters ({_short(got)}) are not the spec's pretrained "
                             f"parameters (init.params_digest {spec.init.params_digest[:16]})")
    for moment, tensors in state.moments(spec).items():
        for name, t in tensors.items():
            if bool(torch.any(t != 0)):
                raise OpeningRefused(f"the initial state's moment {moment}/{name} is not zero")


def validate_opening(
    opening: Opening,
    *,
    expected_digest: bytes,
    run_id: bytes,
    step: int,
    spec_digest: bytes,
    dataset_hash: bytes,
    schedule_commitment: bytes,
    initial_hash: bytes,
    root: bytes,
    size: int,
    copy_state: bool = True,
) -> ValidatedOpening:
    """Check an opening against the chain's facts, cheapest first; each refusal names the problem.

    `copy_state=False` leaves the pre-state's tensors as read-only views of the opening's bytes
    (parse_state_bytes): for a caller that keeps nothing but the verdict, such as the node's
    validate stage, validation then takes no second copy of a state that may be gigabytes.

    Order: opening digest, spec digest, run/step and committed roots, leaf t-1 and t inclusion,
    leaf shapes and steps, schedule proof, sample proofs, pre-state blob digest and length,
    pre-state parse against the spec, pre-state digest vs leaf t-1 (and the initial hash), finiteness.
    """
    import torch

    if not isinstance(opening, Opening):
        raise OpeningRefused(f"validate_opening needs a loaded Opening, got {type(opening).__name__}")
    m = opening.manifest
    t = m["step"]
    if not _eq(opening.digest, expected_digest):
        raise OpeningRefused(f"opening digest {_short(opening.digest)} != the digest on chain "
                             f"{_short(expected_digest)}")
    try:
        spec = Spec.from_cbor(m["spec"])
    except CommitmentError as exc:
        raise OpeningRefused(f"the opening's spec is not usable: {exc}") from None
    if spec.to_cbor() != m["spec"]:
        raise OpeningRefused("the opening's spec is not in canonical form (Spec.to_cbor())")
    if not _eq(spec.digest(), spec_digest):
        raise OpeningRefused(
            f"spec digest {_short(spec.digest())} != the run's spec digest {_short(spec_digest)}"
        )
    if not _eq(m["run_id"], run_id):
        raise OpeningRefused(f"the opening is for run {_short(m['run_id'])}, not run {_short(run_id)}")
    if t != step:
        raise OpeningRefused(f"the opening is for step {t}, the challenge is step {step}")
    if not _eq(m["dataset_hash"], dataset_hash):
        raise OpeningRefused(f"dataset hash {_short(m['dataset_hash'])} != the run's {_short(dataset_hash)}")
    if not _eq(m["schedule_commitment"], schedule_commitment):
        raise OpeningRefused(f"schedule commitment {_short(m['schedule_commitment'])} != the run's "
                             f"{_short(schedule_commitment)}")
    if m["steps"] != spec.steps:
        raise OpeningRefused(f"the schedule has {m['steps']} steps, the spec declares {spec.steps}")
    if not _eq(m["root"], root) or m["size"] != size:
        raise OpeningRefused(f"the opening's tree ({_short(m['root'])}, size {m['size']}) is not the "
                             f"challenged root ({_short(root)}, size {size})")
    if not 1 <= t < size:
        raise OpeningRefused(f"step {t} has no leaf in a tree of {size} leaves")
    if not merkle.verify_inclusion(m["leaf_prev"], t - 1, size, m["leaf_prev_proof"], root):
        raise OpeningRefused(f"leaf {t - 1} is not included in the root at index {t - 1} (bad proof or leaf)")
    if not merkle.verify_inclusion(m["leaf"], t, size, m["leaf_proof"], root):
        raise OpeningRefused(f"leaf {t} is not included in the root at index {t} (bad proof or leaf)")
    try:
        leaf_prev = parse_step_leaf(m["leaf_prev"])
        leaf_t = parse_step_leaf(m["leaf"])
    except CommitmentError as exc:
        raise OpeningRefused(f"a committed leaf is not a step leaf: {exc}") from None
    if leaf_prev.t != t - 1:
        raise OpeningRefused(f"leaf {t - 1} says step {leaf_prev.t}")
    if leaf_t.t != t:
        raise OpeningRefused(f"leaf {t} says step {leaf_t.t}")
    samples = m["samples"]
    if len(samples) != spec.batch.batch_size:
        raise OpeningRefused(f"the batch holds {len(samples)} samples, the spec's batch_size is "
                             f"{spec.batch.batch_size}")
    indices = [s[0] for s in samples]
    if not verify_batch(t, indices, m["steps"], m["schedule_proof"], schedule_commitment):
        raise OpeningRefused(f"batch {indices[:8]}{'...' if len(indices) > 8 else ''} is not the schedule's "
                             f"batch of step {t} (schedule proof fails)")
    dtype = np.dtype(m["token_dtype"]).newbyteorder("<")
    rows = []
    for k, (index, tok, proof) in enumerate(samples):
        if len(tok) != spec.sample_len * dtype.itemsize:
            raise OpeningRefused(f"sample {k} (index {index}) holds {len(tok)} bytes, not {spec.sample_len} "
                                 f"{m['token_dtype']} tokens")
        arr = np.frombuffer(tok, dtype=dtype)
        if not verify_sample(arr, index, m["num_samples"], proof, dataset_hash):
            raise OpeningRefused(f"sample {k} (index {index}) is not in the dataset (dataset proof fails)")
        top = int(arr.max())
        if top >= spec.model.vocab_size:
            raise OpeningRefused(f"sample {k} (index {index}) holds token {top}, outside the vocabulary "
                                 f"of {spec.model.vocab_size}")
        rows.append(arr.astype(np.int64))
    if len(opening.pre_state) != m["pre_state_len"]:
        raise OpeningRefused(
            f"pre-state is {len(opening.pre_state)} bytes, the manifest says {m['pre_state_len']}"
        )
    if not _eq(h(opening.pre_state), m["pre_state_blob"]):
        raise OpeningRefused("pre-state bytes do not match the manifest's blob digest")
    state = parse_state_bytes(opening.pre_state, spec, copy=copy_state)
    if state.step != t - 1:
        raise OpeningRefused(f"the pre-state's step counter is {state.step}, step {t} needs {t - 1}")
    sd = state.digest()
    if not _eq(sd, leaf_prev.state_digest):
        raise OpeningRefused(
            f"pre-state digest {_short(sd)} != leaf {t - 1}'s {_short(leaf_prev.state_digest)}"
        )
    if t == 1 and not _eq(sd, initial_hash):
        raise OpeningRefused(
            f"pre-state digest {_short(sd)} != the run's initial hash {_short(initial_hash)}"
        )
    if t == 1 and spec.init is not None:
        _check_pretrained(state, spec)
    bad = _nonfinite(state)
    if bad is not None:
        raise OpeningRefused(f"pre-state: {bad}")
    batch = torch.from_numpy(np.stack(rows))
    return ValidatedOpening(opening, spec, state, batch, leaf_prev, leaf_t)


# --- the committed loss sequence ----------------------------------------------------------------


def encode_leaves(leaves: Sequence[bytes]) -> bytes:
    """What `GET /runs/{run_id}/leaves` serves: CBOR list of leaf bytes 0..n-1."""
    return cbor.encode([bytes(x) for x in leaves])


def decode_leaves(data: bytes, *, max_bytes: int = MAX_LEAVES_BYTES) -> cbor.ByteStrings:
    """Parse a served leaf list; refuses anything but a canonical CBOR list of byte strings, at the
    first item that is not one. The leaves stay in the list's own bytes (`cbor.ByteStrings`: 4
    bytes of offsets a leaf), not one object each."""
    try:
        return cbor.decode_byte_strings(data, max_bytes=max_bytes)
    except CommitmentError as exc:
        if getattr(exc, "rule", None) == "item-type":
            raise LeavesRefused(f"the leaf list must be a CBOR list of byte strings: {exc}") from None
        raise LeavesRefused(f"the leaf list is not canonical CBOR: {exc}") from None


def verify_leaves(leaves: Sequence[bytes] | bytes, root: bytes, size: int) -> list[StepLeaf]:
    """Parse every leaf and recompute the root; the committed steps 0..size-1 with their losses.
    Served bytes are decoded with `decode_leaves`; no list of the leaves' bytes is made."""
    if isinstance(leaves, (bytes, bytearray, memoryview)):
        leaves = decode_leaves(leaves)
    if not _is_uint(size) or size < 1:
        raise LeavesRefused(f"size must be a positive integer, got {size!r}")
    if len(leaves) < size:
        raise LeavesRefused(f"{len(leaves)} leaves were served, the committed tree has {size}")
    leaves = leaves[:size]  # a prover may already hold leaves past the committed root
    parsed = []
    for i, raw in enumerate(leaves):
        if not isinstance(raw, (bytes, bytearray)):
            raise LeavesRefused(f"leaf {i} is not bytes")
        try:
            leaf = parse_step_leaf(bytes(raw))
        except CommitmentError as exc:
            raise LeavesRefused(f"leaf {i}: {exc}") from None
        if leaf.t != i:
            raise LeavesRefused(f"leaf {i} says step {leaf.t}")
        parsed.append(leaf)
    got = merkle.root(bytes(x) for x in leaves)
    if not _eq(got, root):
        raise LeavesRefused(
            f"the served leaves give root {_short(got)}, the committed root is {_short(root)}"
        )
    return parsed


def committed_losses(leaves: Sequence[StepLeaf]) -> list[float]:
    """Losses of steps 1..n-1 as floats (leaf 0, the initial state, has none)."""
    return [leaf.loss for leaf in leaves[1:]]


__all__ = [
    "DEFAULT_MAX_BYTES",
    "FIELDS",
    "LeavesRefused",
    "MAGIC",
    "OPENING_VERSION",
    "Opening",
    "OpeningRefused",
    "Sample",
    "ValidatedOpening",
    "build_opening",
    "committed_losses",
    "decode_leaves",
    "encode_leaves",
    "encode_opening",
    "load_opening",
    "manifest_digest",
    "opening_digest",
    "parse_state_bytes",
    "state_bytes",
    "validate_opening",
    "verify_leaves",
]
