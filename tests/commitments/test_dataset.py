"""Dataset commitments: sample digests, the dataset hash and proofs, refusals, the default corpus."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitments import merkle
from commitments.dataset import (
    DOCUMENT_SEPARATOR,
    Dataset,
    DatasetError,
    default_corpus_files,
    prepare_default_corpus,
    sample_digest,
    sidecar_path,
    train_validation_split,
    verify_sample,
)
from commitments.hashing import digest


def _save(tmp_path, arr, name="c.npy"):
    p = tmp_path / name
    np.save(p, arr)
    return p


def test_sample_digest_is_the_documented_structure():
    tokens = np.array([1, 2, 300], dtype=np.uint16)
    expected = digest("pot/sample/v1", 5, b"\x01\x00\x02\x00\x2c\x01", "uint16")
    assert sample_digest(5, tokens) == expected
    # Same values, other dtype: another sample.
    assert sample_digest(5, tokens.astype(np.uint32)) != expected
    assert sample_digest(6, tokens) != expected


def test_big_endian_files_digest_as_their_values(tmp_path):
    values = np.arange(40, dtype=np.uint16) * 1000
    le = Dataset.open(_save(tmp_path, values.astype("<u2"), "le.npy"), 8)
    be = Dataset.open(_save(tmp_path, values.astype(">u2"), "be.npy"), 8)
    assert le.dataset_hash == be.dataset_hash


def test_samples_cut_without_overlap_and_remainder_dropped(tmp_path):
    arr = np.arange(23, dtype=np.uint32)
    ds = Dataset.open(_save(tmp_path, arr), 5)
    assert ds.num_samples == 4
    assert ds.sample(0).tolist() == [0, 1, 2, 3, 4]
    assert ds.sample(3).tolist() == [15, 16, 17, 18, 19]
    assert ds.sample(3).dtype == np.uint32
    # The dropped tail (20, 21, 22) does not enter the hash.
    other = arr.copy()
    other[20:] = 7
    assert Dataset.open(_save(tmp_path, other, "o.npy"), 5).dataset_hash == ds.dataset_hash


def test_batch_is_int64_rows_in_the_given_order(tmp_path):
    ds = Dataset.open(_save(tmp_path, np.arange(30, dtype=np.uint16)), 3)
    b = ds.batch([4, 0, 4])
    assert b.dtype == np.int64 and b.shape == (3, 3)
    assert b.tolist() == [[12, 13, 14], [0, 1, 2], [12, 13, 14]]
    assert ds.batch([]).shape == (0, 3)


def test_dataset_hash_is_the_merkle_root_over_sample_digests(tmp_path):
    arr = np.random.default_rng(1).integers(0, 65536, size=1000, dtype=np.uint16)
    ds = Dataset.open(_save(tmp_path, arr), 13)
    leaves = [sample_digest(i, arr[i * 13:(i + 1) * 13]) for i in range(ds.num_samples)]
    assert ds.dataset_hash == merkle.root(leaves)
    assert ds.sample_digest(9) == leaves[9]


def test_fast_leaf_hashes_match_the_reference_across_cbor_int_widths(tmp_path):
    # sample_len 1 and 70000 samples: indices cross the 1-, 2- and 4-byte CBOR integer heads.
    arr = np.arange(70_000, dtype=np.uint32) * np.uint32(2654435761)  # wraps mod 2**32
    ds = Dataset.open(_save(tmp_path, arr), 1)
    hashes = ds.leaf_hashes()
    for i in (0, 23, 24, 255, 256, 65535, 65536, 69_999):
        assert hashes[i] == merkle.leaf_hash(sample_digest(i, arr[i:i + 1])), i


def test_every_sample_proof_verifies_and_tampering_is_rejected(tmp_path):
    arr = np.random.default_rng(2).integers(0, 256, size=17 * 7 + 3, dtype=np.uint16)
    ds = Dataset.open(_save(tmp_path, arr), 7)
    n, root = ds.num_samples, ds.dataset_hash
    for i in range(n):
        tokens, proof = ds.sample(i), ds.sample_proof(i)
        assert verify_sample(tokens, i, n, proof, root)
        bad = tokens.copy()
        bad[0] ^= 1
        assert not verify_sample(bad, i, n, proof, root)
        assert not verify_sample(tokens.astype(np.uint32), i, n, proof, root)
        assert not verify_sample(tokens, (i + 1) % n, n, proof, root)
        assert not verify_sample(tokens, i, n, proof, bytes(32))
        if proof:
            assert not verify_sample(tokens, i, n, [bytes(32)] + proof[1:], root)
    assert not verify_sample(ds.sample(0), n, n, ds.sample_proof(0), root)
    assert not verify_sample(ds.sample(0).astype(np.int64), 0, n, ds.sample_proof(0), root)


@settings(max_examples=30, deadline=None)
@given(n_tokens=st.integers(1, 300), sample_len=st.integers(1, 40), data=st.data())
def test_proofs_at_every_size(n_tokens, sample_len, data):
    if n_tokens < sample_len:
        return
    arr = np.arange(n_tokens, dtype=np.uint16)
    ds = Dataset(arr, sample_len)
    i = data.draw(st.integers(0, ds.num_samples - 1))
    assert verify_sample(ds.sample(i), i, ds.num_samples, ds.sample_proof(i), ds.dataset_hash)


@pytest.mark.parametrize(
    ("arr", "sample_len", "reason"),
    [
        (np.zeros(10, dtype=np.float32), 2, "dtype float32"),
        (np.zeros(10, dtype=np.int64), 2, "dtype int64"),
        (np.zeros(10, dtype=np.uint8), 2, "dtype uint8"),
        (np.zeros((2, 5), dtype=np.uint16), 2, "1-D"),
        (np.zeros(0, dtype=np.uint16), 2, "empty"),
        (np.zeros(4, dtype=np.uint16), 5, "too few for one sample"),
    ],
)
def test_bad_corpora_are_refused_with_the_problem(tmp_path, arr, sample_len, reason):
    with pytest.raises(DatasetError, match=reason):
        Dataset.open(_save(tmp_path, arr), sample_len)


def test_tokens_outside_the_vocabulary_are_refused_with_their_position(tmp_path):
    arr = np.full(100, 3, dtype=np.uint16)
    arr[57] = 256
    p = _save(tmp_path, arr)
    with pytest.raises(DatasetError, match="token 256 at position 57 is outside the vocabulary of 256"):
        Dataset.open(p, 10, vocab_size=256)
    assert Dataset.open(p, 10, vocab_size=257).num_samples == 10


def test_unreadable_files_and_bad_arguments_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="no such corpus"):
        Dataset.open(tmp_path / "missing.npy", 4)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"this is not numpy")
    with pytest.raises(DatasetError, match="not a plain .npy"):
        Dataset.open(junk, 4)
    objs = tmp_path / "objs.npy"
    np.save(objs, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DatasetError, match="not a plain .npy"):
        Dataset.open(objs, 4)
    ok = _save(tmp_path, np.arange(20, dtype=np.uint16))
    for bad_len in (0, -3, 2.0, True):
        with pytest.raises(DatasetError, match="sample_len"):
            Dataset.open(ok, bad_len)
    ds = Dataset.open(ok, 4)
    with pytest.raises(DatasetError, match="out of range: the dataset has 5 samples"):
        ds.sample(5)
    with pytest.raises(DatasetError, match="out of range"):
        ds.batch([0, -1])
    with pytest.raises(DatasetError, match="must be an int"):
        ds.sample_proof("1")
    with pytest.raises(DatasetError, match="non-negative"):
        sample_digest(-1, np.zeros(3, dtype=np.uint16))


@given(n=st.integers(2, 10**7), frac=st.sampled_from([0.05, 0.1, 0.5, 0.01]))
def test_train_validation_split_partitions_with_validation_last(n, frac):
    train, val = train_validation_split(n, frac)
    assert train.start == 0 and train.stop == val.start and val.stop == n
    assert len(train) >= 1 and len(val) >= 1
    # At least the requested fraction is held out, and at most one sample more (or the minimum of 1).
    assert len(val) >= min(n - 1, n * frac)
    assert len(val) <= max(1, n * frac + 1)


def test_train_validation_split_refusals_and_default():
    train, val = train_validation_split(100)
    assert (len(train), len(val)) == (95, 5)
    with pytest.raises(DatasetError, match="at least 2"):
        train_validation_split(1)
    with pytest.raises(DatasetError, match="validation_fraction"):
        train_validation_split(10, 1.0)


def test_default_corpus_is_deterministic_byte_level_text(tmp_path):
    a = prepare_default_corpus(tmp_path / "a" / "corpus.npy", max_bytes=400_000)
    b = prepare_default_corpus(tmp_path / "b" / "corpus.npy", max_bytes=400_000)
    raw_a = (tmp_path / "a" / "corpus.npy").read_bytes()
    assert raw_a == (tmp_path / "b" / "corpus.npy").read_bytes()
    assert a.file_list_digest == b.file_list_digest and a.content_digest == b.content_digest
    ds = Dataset.open(a.path, 65, vocab_size=256)
    assert ds.tokens.dtype == np.uint16
    assert a.num_tokens <= 400_000
    # Real source text: the first file's bytes, then the separator.
    first = default_corpus_files()[0].read_bytes()
    assert bytes(ds.tokens[: len(first)].astype(np.uint8)) == first
    assert int(ds.tokens[len(first)]) == DOCUMENT_SEPARATOR
    assert int(np.count_nonzero(np.asarray(ds.tokens) == DOCUMENT_SEPARATOR)) == a.num_files
    # No temporary files left behind by the atomic writes.
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["corpus.npy", "corpus.npy.json"]


def test_default_corpus_sidecar_records_version_and_file_list(tmp_path):
    out = tmp_path / "corpus.npy"
    info = prepare_default_corpus(out, max_bytes=200_000)
    meta = json.loads(sidecar_path(out).read_text())
    assert meta["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert meta["file_list_digest"] == info.file_list_digest.hex()
    assert meta["num_tokens"] == info.num_tokens == int(np.load(out).size)
    assert meta["num_files"] == info.num_files >= 1
    assert meta["vocab_size"] == 256 and meta["dtype"] == "uint16"
    files = default_corpus_files()
    assert [f.name for f in files] == sorted(f.name for f in files)
    assert all(f.suffix == ".py" for f in files)
    listing = [[f.name, f.stat().st_size] for f in files[: info.num_files]]
    assert info.file_list_digest == digest("pot/corpus-files/v1", listing)


def test_default_corpus_refusals(tmp_path):
    with pytest.raises(DatasetError, match=r"\.npy"):
        prepare_default_corpus(tmp_path / "corpus.bin")
    with pytest.raises(DatasetError, match="too small"):
        prepare_default_corpus(tmp_path / "c.npy", max_bytes=10)
