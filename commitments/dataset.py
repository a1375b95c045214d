"""Token corpora as commitments: a .npy array of token ids cut into fixed-length samples.

A sample is `sample_len` consecutive tokens (non-overlapping; a trailing remainder is dropped).
Its digest is digest("pot/sample/v1", index, little-endian token bytes, dtype name); the dataset
hash is the Merkle root over the sample digests (each digest is the leaf data). The digest
binds the index, so a proof can never present one sample in another's place.

`prepare_default_corpus` builds the default corpus from text present on every machine without a
download: the Python standard library's own top-level .py sources, tokenised at byte level.
"""

from __future__ import annotations

import json
import math
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from commitments import merkle
from commitments.errors import CommitmentError
from commitments.files import atomic_write_text, atomic_write_with
from commitments.hashing import digest, h

SAMPLE_DOMAIN = "pot/sample/v1"
ALLOWED_DTYPES = ("uint16", "uint32")

# The default corpus: byte-level tokens (vocab 256) stored as uint16.
DEFAULT_VOCAB_SIZE = 256
DEFAULT_DTYPE = "uint16"
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
# Byte 0 never occurs in Python source text, so it marks the boundary between two files.
DOCUMENT_SEPARATOR = 0
VALIDATION_FRACTION = 0.05
CORPUS_FORMAT = "pot/corpus/v1"


class DatasetError(CommitmentError):
    """A corpus file or sample request that cannot be used, with the reason."""


# --- sample digests and verification (pure) ---------------------------------------------------


def _le_bytes(tokens: np.ndarray) -> tuple[bytes, str]:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise DatasetError(f"a sample is a 1-D token array, got shape {tuple(arr.shape)}")
    name = arr.dtype.name
    if name not in ALLOWED_DTYPES:
        raise DatasetError(f"sample dtype {name} is not one of {', '.join(ALLOWED_DTYPES)}")
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(), name


def sample_digest(index: int, tokens: np.ndarray) -> bytes:
    """digest("pot/sample/v1", index, token bytes (little-endian), dtype name)."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise DatasetError(f"sample index must be a non-negative int, got {index!r}")
    data, dtype = _le_bytes(tokens)
    return digest(SAMPLE_DOMAIN, index, data, dtype)


def verify_sample(
    tokens: np.ndarray, index: int, num_samples: int, proof: Sequence[bytes], dataset_hash: bytes
) -> bool:
    """True iff `tokens` is sample `index` of the dataset with this hash and sample count."""
    if not isinstance(num_samples, int) or not 0 <= index < num_samples:
        return False
    try:
        leaf = sample_digest(index, tokens)
    except DatasetError:
        return False
    return merkle.verify_inclusion(leaf, index, num_samples, list(proof), dataset_hash)


def train_validation_split(
    num_samples: int, validation_fraction: float = VALIDATION_FRACTION
) -> tuple[range, range]:
    """The held-out convention: the last ceil(fraction * n) samples are validation, the rest train.

    Training schedules draw from the train range only (indices 0..n_train-1), so a schedule over
    `len(train)` samples never touches validation data.
    """
    if not isinstance(num_samples, int) or num_samples < 2:
        raise DatasetError(f"a train/validation split needs at least 2 samples, got {num_samples!r}")
    if not 0.0 < validation_fraction < 1.0:
        raise DatasetError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    n_val = min(num_samples - 1, max(1, math.ceil(num_samples * validation_fraction)))
    n_train = num_samples - n_val
    return range(0, n_train), range(n_train, num_samples)


# --- the dataset ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetInfo:
    path: str
    dtype: str
    num_tokens: int
    sample_len: int
    num_samples: int
    dataset_hash: bytes

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "sample_len": self.sample_len,
            "num_samples": self.num_samples,
            "dataset_hash": self.dataset_hash.hex(),
        }


class Dataset:
    """A memory-mapped token corpus viewed as `num_samples` samples of `sample_len` tokens."""

    def __init__(self, tokens: np.ndarray, sample_len: int, *, path: str = "<memory>",
                 vocab_size: int | None = None) -> None:
        if not isinstance(sample_len, int) or isinstance(sample_len, bool) or sample_len <= 0:
            raise DatasetError(f"sample_len must be a positive int, got {sample_len!r}")
        if tokens.ndim != 1:
            raise DatasetError(f"{path}: a corpus is a 1-D token array, got shape {tuple(tokens.shape)}")
        if tokens.dtype.name not in ALLOWED_DTYPES:
            raise DatasetError(
                f"{path}: token dtype {tokens.dtype.name} is not one of {', '.join(ALLOWED_DTYPES)}"
            )
        if tokens.size == 0:
            raise DatasetError(f"{path}: the corpus is empty")
        if tokens.size < sample_len:
            raise DatasetError(
                f"{path}: {tokens.size} tokens are too few for one sample of {sample_len} tokens"
            )
        if vocab_size is not None:
            _check_vocab(tokens, vocab_size, path)
        self.path = path
        self.tokens = tokens
        self.sample_len = sample_len
        self.vocab_size = vocab_size
        self.num_samples = tokens.size // sample_len
        self._tree: merkle.MerkleTree | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str], sample_len: int, *, vocab_size: int | None = None) -> Dataset:
        """Memory-map a .npy corpus. Refuses wrong dtypes, empty or too-short files, bad tokens."""
        p = Path(path)
        if not p.is_file():
            raise DatasetError(f"{p}: no such corpus file")
        try:
            tokens = np.load(p, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:
            raise DatasetError(f"{p}: not a plain .npy token array ({exc})") from None
        except OSError as exc:
            raise DatasetError(f"{p}: cannot read corpus: {exc}") from None
        if not isinstance(tokens, np.ndarray):
            raise DatasetError(f"{p}: expected a single .npy array, not an archive")
        return cls(tokens, sample_len, path=str(p), vocab_size=vocab_size)

    def _check_index(self, i: int) -> int:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise DatasetError(f"sample index must be an int, got {type(i).__name__}")
        i = int(i)
        if not 0 <= i < self.num_samples:
            raise DatasetError(f"sample index {i} out of range: the dataset has {self.num_samples} samples")
        return i

    def sample(self, i: int) -> np.ndarray:
        """Sample i as a fresh array in the corpus dtype."""
        i = self._check_index(i)
        return np.array(self.tokens[i * self.sample_len:(i + 1) * self.sample_len])

    def batch(self, indices: Sequence[int]) -> np.ndarray:
        """The samples at `indices`, in order, as an int64 array [len(indices), sample_len]."""
        idx = [self._check_index(i) for i in indices]
        out = np.empty((len(idx), self.sample_len), dtype=np.int64)
        for row, i in enumerate(idx):
            out[row] = self.tokens[i * self.sample_len:(i + 1) * self.sample_len]
        return out

    def sample_digest(self, i: int) -> bytes:
        return sample_digest(self._check_index(i), self.sample(i))

    @property
    def tree(self) -> merkle.MerkleTree:
        """The tree over the sample digests, built once (2 * num_samples digests, packed)."""
        if self._tree is None:
            self._tree = merkle.MerkleTree(_leaf_hashes(self.tokens, self.sample_len, self.num_samples))
        return self._tree

    def leaf_hashes(self) -> list[bytes]:
        """Merkle leaf hashes of every sample digest."""
        tree = self.tree
        return [tree.leaf_hash(i) for i in range(self.num_samples)]

    @property
    def dataset_hash(self) -> bytes:
        return self.tree.root()

    def sample_proof(self, i: int) -> list[bytes]:
        """Inclusion proof of sample i under `dataset_hash` (O(log n) once the tree is built)."""
        return self.tree.inclusion_proof(self._check_index(i))

    def info(self) -> DatasetInfo:
        return DatasetInfo(self.path, self.tokens.dtype.name, int(self.tokens.size), self.sample_len,
                           self.num_samples, self.dataset_hash)


def _check_vocab(tokens: np.ndarray, vocab_size: int, path: str) -> None:
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise DatasetError(f"vocab_size must be a positive int, got {vocab_size!r}")
    chunk = 1 << 24  # bounded memory on large memory-mapped corpora
    for start in range(0, tokens.size, chunk):
        part = tokens[start:start + chunk]
        top = int(part.max())
        if top >= vocab_size:
            pos = start + int(np.argmax(part >= vocab_size))
            raise DatasetError(
                f"{path}: token {int(tokens[pos])} at position {pos} is outside the vocabulary of "
                f"{vocab_size}"
            )


def _leaf_hashes(tokens: np.ndarray, sample_len: int, num_samples: int) -> list[bytes]:
    # The CBOR of ["pot/sample/v1", i, bytes, dtype] differs between samples only in the index
    # and the token bytes, so the fixed parts are encoded once; tests check this equals
    # `sample_digest` for every index kind (small, 1-, 2-, 4-byte heads).
    from commitments import cbor

    dtype = tokens.dtype.name
    le = tokens.dtype.newbyteorder("<")
    nbytes = sample_len * tokens.dtype.itemsize
    head = b"\x84" + cbor.encode(SAMPLE_DOMAIN)
    tail = cbor.encode(b"\x00" * nbytes)[: -nbytes or None]
    suffix = cbor.encode(dtype)
    leaf_hash = merkle.leaf_hash
    out: list[bytes] = []
    chunk_samples = max(1, (1 << 22) // sample_len)
    for first in range(0, num_samples, chunk_samples):
        last = min(num_samples, first + chunk_samples)
        block = np.ascontiguousarray(tokens[first * sample_len:last * sample_len], dtype=le).tobytes()
        for k in range(last - first):
            i = first + k
            body = head + cbor.encode(i) + tail + block[k * nbytes:(k + 1) * nbytes] + suffix
            out.append(leaf_hash(h(body)))
    return out


# --- the default corpus -----------------------------------------------------------------------


def default_corpus_files() -> list[Path]:
    """The fixed selection: every .py file directly in the standard library directory, by name.

    Subpackages (test suites, idlelib, ...) are left out; sorting by file name makes the order
    independent of the file system.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if not stdlib.is_dir():
        raise DatasetError(f"the Python standard library directory {stdlib} is missing")
    files = sorted((p for p in stdlib.glob("*.py") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise DatasetError(f"no .py sources found in {stdlib}")
    return files


def sidecar_path(out_path: str | os.PathLike[str]) -> Path:
    p = Path(out_path)
    return p.with_name(p.name + ".json")


@dataclass(frozen=True)
class CorpusInfo:
    path: str
    sidecar: str
    num_tokens: int
    num_files: int
    python_version: str
    file_list_digest: bytes
    content_digest: bytes


def prepare_default_corpus(
    out_path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES
) -> CorpusInfo:
    """Write the default byte-level corpus to `out_path` (.npy, uint16) and its sidecar JSON.

    Files from `default_corpus_files()` are taken whole, in order, each followed by byte 0, until
    adding the next file would pass `max_bytes`. The result is deterministic for one Python
    version; the sidecar records that version and a digest of the file list and sizes.
    """
    out = Path(out_path)
    if out.suffix != ".npy":
        raise DatasetError(f"{out}: the corpus is written as a .npy file; use a name ending in .npy")
    if max_bytes <= 0:
        raise DatasetError(f"max_bytes must be positive, got {max_bytes}")
    parts: list[bytes] = []
    listing: list[list[Any]] = []
    total = 0
    for f in default_corpus_files():
        data = f.read_bytes()
        if total + len(data) + 1 > max_bytes:
            break
        parts.append(data)
        parts.append(bytes([DOCUMENT_SEPARATOR]))
        listing.append([f.name, len(data)])
        total += len(data) + 1
    if not parts:
        raise DatasetError(f"max_bytes={max_bytes} is too small for even the first source file")
    raw = b"".join(parts)
    tokens = np.frombuffer(raw, dtype=np.uint8).astype("<u2")
    python_version = ".".join(str(x) for x in sys.version_info[:3])
    file_list_digest = digest("pot/corpus-files/v1", listing)
    content_digest = h(raw)
    atomic_write_with(out, lambda f: np.save(f, tokens, allow_pickle=False))
    meta = {
        "format": CORPUS_FORMAT,
        "tokenizer": "bytes",
        "vocab_size": DEFAULT_VOCAB_SIZE,
        "dtype": DEFAULT_DTYPE,
        "document_separator": DOCUMENT_SEPARATOR,
        "num_tokens": int(tokens.size),
        "python_version": python_version,
        "python_implementation": sys.implementation.name,
        "source": "top-level .py files of the Python standard library, sorted by name",
        "num_files": len(listing),
        "file_list_digest": file_list_digest.hex(),
        "content_digest": content_digest.hex(),
        "validation_fraction": VALIDATION_FRACTION,
        "split": "the last ceil(validation_fraction * num_samples) samples are validation",
    }
    side = sidecar_path(out)
    atomic_write_text(side, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return CorpusInfo(str(out), str(side), int(tokens.size), len(listing), python_version,
                      file_list_digest, content_digest)


__all__ = [
    "ALLOWED_DTYPES",
    "Dataset",
    "DatasetError",
    "DatasetInfo",
    "CorpusInfo",
    "default_corpus_files",
    "prepare_default_corpus",
    "sample_digest",
    "sidecar_path",
    "train_validation_split",
    "verify_sample",
]
