"""Tensor and state digests: what a step leaf commits to about a training state.

A tensor digest is BLAKE3 over the CBOR header ["pot/tensor/v1", name, dtype, shape] followed by
the tensor's little-endian bytes in row-major order; a state digest binds the ordered list of
(name, tensor digest) pairs. Tensor memory is fed to BLAKE3 in place (multi-threaded when large).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import blake3 as _blake3
import numpy as np

from commitments.errors import CommitmentError
from commitments.hashing import digest, structure_bytes

TENSOR_DOMAIN = "pot/tensor/v1"
STATE_DOMAIN = "pot/state/v1"

# Below this size BLAKE3's thread fan-out costs more than it saves.
MT_THRESHOLD = 1 << 20
# In a whole state, tensors this large get all of BLAKE3's threads; smaller ones share a pool.
LARGE_TENSOR = 32 << 20
# A tensor that must be copied to become row-major (strided views, foreign byte order) is
# copied this many bytes at a time, so hashing never holds a second full copy of it.
CHUNK_BYTES = 64 << 20

# Element types a training state may hold, keyed by the name that goes into the digest.
_NUMPY_DTYPES = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
SUPPORTED_DTYPES = (*_NUMPY_DTYPES, "bfloat16")


class TensorDigestError(CommitmentError):
    """A tensor or state that cannot be digested (unsupported dtype, bad name, duplicate...)."""


def _torch():
    # torch is only present when the caller handed us torch tensors; never import it here.
    return sys.modules.get("torch")


def _is_torch(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype_name(t: Any) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in SUPPORTED_DTYPES:
        raise TensorDigestError(
            f"tensor dtype torch.{name} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}"
        )
    return name


def _numpy_dtype_name(a: np.ndarray) -> str:
    dt = a.dtype
    for name, ref in _NUMPY_DTYPES.items():
        if dt.kind == ref.kind and dt.itemsize == ref.itemsize and dt.fields is None:
            return name
    raise TensorDigestError(
        f"array dtype {dt} is not supported; use one of {', '.join(_NUMPY_DTYPES)}"
    )


def _slabs(x: Any, ready: Callable[[Any], bool], copy: Callable[[Any], Any], itemsize: int) -> Iterable[Any]:
    """Pieces of `x` that concatenate to its row-major contents, each `ready` (usable in place)
    or a `copy` of at most about CHUNK_BYTES, so no full second copy of `x` is ever held."""
    if ready(x):
        yield x
        return
    if x.ndim == 1:
        step = max(1, CHUNK_BYTES // itemsize)
        for i in range(0, x.shape[0], step):
            yield copy(x[i : i + step])
        return
    row_bytes = itemsize * math.prod(x.shape[1:])
    if row_bytes > CHUNK_BYTES:
        for i in range(x.shape[0]):
            yield from _slabs(x[i], ready, copy, itemsize)
        return
    rows = max(1, CHUNK_BYTES // max(1, row_bytes))
    for i in range(0, x.shape[0], rows):
        yield copy(x[i : i + rows])


def _byte_view(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


def _le_chunks_numpy(a: np.ndarray) -> Iterable[Any]:
    """Row-major little-endian bytes of `a` as buffers; zero-copy when `a` is already so."""
    le = a.dtype.newbyteorder("<")
    native_le = a.dtype.byteorder == "<" or (a.dtype.byteorder in ("=", "|") and sys.byteorder == "little")
    if a.ndim == 0:
        a = a.reshape(1)

    def ready(x: np.ndarray) -> bool:
        return native_le and x.flags.c_contiguous

    for slab in _slabs(a, ready, lambda x: np.ascontiguousarray(x, dtype=le), a.dtype.itemsize):
        if slab.size:
            yield _byte_view(slab)


def _torch_as_numpy(t: Any) -> np.ndarray:
    # numpy has no bfloat16; its bits are hashed through an int16 view of the same memory.
    torch = _torch()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def _le_chunks_torch(t: Any) -> Iterable[Any]:
    torch = _torch()
    if t.layout != torch.strided:
        raise TensorDigestError(f"tensor layout {t.layout} is not supported; densify it first")
    if t.is_quantized:
        raise TensorDigestError("quantized tensors are not supported; dequantize them first")
    if t.device.type == "meta":
        raise TensorDigestError("a tensor on the meta device has no data to digest")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if t.dim() == 0:
        t = t.reshape(1)
    for slab in _slabs(t, lambda x: x.is_contiguous(), lambda x: x.contiguous(), t.element_size()):
        yield from _le_chunks_numpy(_torch_as_numpy(slab))


def _header_and_chunks(name: str, tensor: Any) -> tuple[bytes, Iterable[Any], int]:
    if not isinstance(name, str) or not name:
        raise TensorDigestError(f"tensor name must be a non-empty str, got {name!r}")
    if _is_torch(tensor):
        dtype = _torch_dtype_name(tensor)
        shape = list(tensor.shape)
        nbytes = tensor.numel() * tensor.element_size()
        chunks = _le_chunks_torch(tensor)
    elif isinstance(tensor, (np.ndarray, np.generic)):
        arr = np.asarray(tensor)
        dtype = _numpy_dtype_name(arr)
        shape = list(arr.shape)
        nbytes = arr.nbytes
        chunks = _le_chunks_numpy(arr)
    else:
        raise TensorDigestError(
            f"tensor {name!r} must be a torch.Tensor or numpy array, got {type(tensor).__name__}"
        )
    header = structure_bytes(TENSOR_DOMAIN, name, dtype, [int(d) for d in shape])
    return header, chunks, nbytes


def _digest(name: str, tensor: Any, multithread: bool, key: bytes | None = None) -> bytes:
    header, chunks, nbytes = _header_and_chunks(name, tensor)
    threads = _blake3.blake3.AUTO if multithread and nbytes >= MT_THRESHOLD else 1
    if key is None:
        hasher = _blake3.blake3(header, max_threads=threads)
    else:
        hasher = _blake3.blake3(header, key=key, max_threads=threads)
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.digest()


def tensor_digest(name: str, tensor: Any) -> bytes:
    """BLAKE3 of CBOR(["pot/tensor/v1", name, dtype, shape]) || little-endian row-major bytes."""
    return _digest(name, tensor, multithread=True)


def _nbytes(tensor: Any) -> int:
    if _is_torch(tensor):
        return tensor.numel() * tensor.element_size()
    return int(getattr(tensor, "nbytes", 0))


def _pairs(items: Any) -> list[tuple[str, Any]]:
    if isinstance(items, Mapping):
        items = list(items.items())
    elif isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TensorDigestError(
            f"state must be an ordered sequence of (name, tensor) pairs, got {type(items).__name__}"
        )
    pairs = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TensorDigestError(f"state entry {i} must be a (name, tensor) pair, got {item!r:.80}")
        name, tensor = item
        if not isinstance(name, str) or not name:
            raise TensorDigestError(f"state entry {i} has name {name!r}; names are non-empty strings")
        if name in seen:
            raise TensorDigestError(f"state has two tensors named {name!r}; names must be unique")
        seen.add(name)
        pairs.append((name, tensor))
    return pairs


def tensor_digests(
    items: Any, max_workers: int | None = None, *, key: bytes | None = None
) -> list[tuple[str, bytes]]:
    """[(name, tensor_digest)] in the given order.

    Tensors of at least LARGE_TENSOR bytes are hashed one after another, each over all of
    BLAKE3's threads; the many smaller ones are spread over a thread pool, one thread each,
    because BLAKE3 releases the GIL and fanning a few MB out over threads costs more than it gains.
    """
    pairs = _pairs(items)
    workers = max_workers or os.cpu_count() or 1
    out: list[bytes | None] = [None] * len(pairs)
    large = [i for i, (_, t) in enumerate(pairs) if _nbytes(t) >= LARGE_TENSOR]
    rest = [i for i, (_, t) in enumerate(pairs) if _nbytes(t) < LARGE_TENSOR]
    if workers <= 1 or len(rest) <= 1:
        for i in rest:
            out[i] = _digest(*pairs[i], multithread=workers > 1, key=key)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tensor-digest") as pool:
            for i, d in zip(rest, pool.map(lambda i: _digest(*pairs[i], multithread=False, key=key), rest),
                            strict=True):
                out[i] = d
    for i in large:
        out[i] = _digest(*pairs[i], multithread=True, key=key)
    return [(n, d) for (n, _), d in zip(pairs, out, strict=True)]


def keyed_tensor_digests(items: Any, key: bytes, max_workers: int | None = None) -> list[tuple[str, bytes]]:
    """[(name, keyed digest)]: `tensor_digests` with BLAKE3 in keyed mode under a 32-byte `key`
    (the same header and bytes; no digest of one key says anything about another's)."""
    if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
        raise TensorDigestError("a keyed tensor digest needs a 32-byte key")
    return tensor_digests(items, max_workers, key=bytes(key))


def state_digest_from_digests(named_digests: Iterable[tuple[str, bytes]]) -> bytes:
    """digest("pot/state/v1", [[name, tensor_digest], ...]) from precomputed tensor digests."""
    entries = []
    seen: set[str] = set()
    for i, item in enumerate(named_digests):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TensorDigestError(f"entry {i} must be a (name, digest) pair")
        name, d = item
        if not isinstance(name, str) or not name:
            raise TensorDigestError(f"entry {i} has name {name!r}; names are non-empty strings")
        if name in seen:
            raise TensorDigestError(f"state has two tensors named {name!r}; names must be unique")
        if not isinstance(d, bytes) or len(d) != 32:
            raise TensorDigestError(f"digest of {name!r} must be 32 bytes")
        seen.add(name)
        entries.append([name, d])
    return digest(STATE_DOMAIN, entries)


def state_digest(items: Any, max_workers: int | None = None) -> bytes:
    """Digest of a training state given as ordered (name, tensor) pairs (or an ordered mapping).

    The order is the caller's canonical order (the oracle defines it): reordering changes the
    digest. Duplicate names are refused.
    """
    return state_digest_from_digests(tensor_digests(items, max_workers))
