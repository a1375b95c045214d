"""Tensor and state digests: what changes them, what must not, and what is refused."""

from __future__ import annotations

import blake3
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from commitments import cbor
from commitments import tensors as T
from commitments.errors import CommitmentError
from commitments.hashing import digest


def rand(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


def test_digest_is_blake3_of_header_then_little_endian_bytes():
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    header = cbor.encode(["pot/tensor/v1", "w", "float32", [2, 3]])
    assert T.tensor_digest("w", a) == blake3.blake3(header + a.tobytes()).digest()
    b = np.array([1, -2, 3], dtype="<i8")
    header = cbor.encode(["pot/tensor/v1", "step", "int64", [3]])
    assert T.tensor_digest("step", b) == blake3.blake3(header + b.tobytes()).digest()


def test_digest_changes_with_name_dtype_shape_and_one_bit():
    t = rand(4, 6)
    base = T.tensor_digest("layer.weight", t)
    assert T.tensor_digest("layer.bias", t) != base
    assert T.tensor_digest("layer.weight", t.double()) != base
    assert T.tensor_digest("layer.weight", t.reshape(6, 4)) != base
    assert T.tensor_digest("layer.weight", t.reshape(24)) != base
    same_bits_other_dtype = t.view(torch.int32)
    assert T.tensor_digest("layer.weight", same_bits_other_dtype) != base
    for index in (0, 11, 23):
        for bit in (0, 17, 31):
            flipped = t.clone().reshape(-1).view(torch.int32)
            flipped[index] ^= 1 << bit
            assert T.tensor_digest("layer.weight", flipped.view(torch.float32).reshape(4, 6)) != base
    assert T.tensor_digest("layer.weight", t.clone()) == base


def test_layout_does_not_matter_only_logical_content():
    t = rand(37, 53)
    base = T.tensor_digest("w", t)
    transposed_copy = t.t().contiguous().t()  # same values, column-major storage
    assert not transposed_copy.is_contiguous()
    assert T.tensor_digest("w", transposed_copy) == base
    assert T.tensor_digest("w", t.t().contiguous()) == T.tensor_digest("w", t.t())
    assert T.tensor_digest("w", t.numpy()) == base
    assert T.tensor_digest("w", np.asfortranarray(t.numpy())) == base
    assert T.tensor_digest("w", t.numpy().astype(">f4")) == base  # big-endian storage, same values
    sliced = rand(10, 20)[:, ::3]
    assert T.tensor_digest("s", sliced) == T.tensor_digest("s", sliced.contiguous().numpy())


def test_strided_tensors_are_hashed_in_slabs(monkeypatch):
    monkeypatch.setattr(T, "CHUNK_BYTES", 256)  # force many slabs for a small tensor
    t = rand(40, 30)
    expected = T.tensor_digest("w", t.clone())
    assert T.tensor_digest("w", t.t().contiguous().t()) == expected
    assert T.tensor_digest("w", t.numpy().astype(">f4")) == expected
    assert T.tensor_digest("w", np.asfortranarray(t.numpy())) == expected


def test_copies_stay_bounded_even_for_long_strided_rows(monkeypatch):
    monkeypatch.setattr(T, "CHUNK_BYTES", 64)
    cases = [rand(50, 3).t(), rand(300)[::3], rand(4, 5, 40).permute(2, 0, 1), rand(7, 9).t()]
    for t in cases:
        assert not t.is_contiguous()
        expected = T.tensor_digest("w", t.contiguous())
        assert T.tensor_digest("w", t) == expected
        assert T.tensor_digest("w", t.numpy()) == expected
        pieces = list(T._le_chunks_torch(t))
        assert b"".join(bytes(p) for p in pieces) == t.contiguous().numpy().tobytes()
        assert max(len(p) for p in pieces) <= 64


def test_numpy_and_torch_agree_for_every_dtype():
    base = torch.arange(-3, 9).reshape(3, 4)
    for dt in (torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
               torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64):
        t = base.to(dt)
        assert T.tensor_digest("x", t) == T.tensor_digest("x", t.numpy()), dt
    assert T.tensor_digest("x", np.arange(5, dtype=np.uint32)) != T.tensor_digest(
        "x", np.arange(5, dtype=np.int32)
    )


def test_bfloat16_is_hashed_by_its_bits():
    t = rand(5, 7).bfloat16()
    header = cbor.encode(["pot/tensor/v1", "b", "bfloat16", [5, 7]])
    raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
    assert T.tensor_digest("b", t) == blake3.blake3(header + raw).digest()
    assert T.tensor_digest("b", t) != T.tensor_digest("b", t.view(torch.int16))


def test_scalars_empty_tensors_and_grad_tensors():
    assert T.tensor_digest("step", torch.tensor(7)) == T.tensor_digest("step", np.int64(7))
    assert T.tensor_digest("step", torch.tensor(7)) != T.tensor_digest("step", torch.tensor([7]))
    assert T.tensor_digest("e", torch.empty(0, 3)) != T.tensor_digest("e", torch.empty(3, 0))
    p = torch.nn.Parameter(rand(3, 3))
    assert T.tensor_digest("p", p) == T.tensor_digest("p", p.detach().numpy())


def test_large_tensor_uses_the_same_bytes_as_small_chunks():
    big = rand(1 << 19)  # 2 MiB: above the multi-threading threshold
    header = cbor.encode(["pot/tensor/v1", "big", "float32", [1 << 19]])
    assert T.tensor_digest("big", big) == blake3.blake3(header + big.numpy().tobytes()).digest()


@pytest.mark.parametrize("bad,reason", [
    (torch.zeros(2, dtype=torch.complex64), "not supported"),
    (np.zeros(2, dtype=np.complex128), "not supported"),
    (np.array(["a", "b"]), "not supported"),
    (np.array([object()]), "not supported"),
    (torch.zeros(3).to_sparse(), "layout"),
    (torch.zeros(3, device="meta"), "meta device"),
    ([1.0, 2.0], "must be a torch.Tensor or numpy array"),
    (3.0, "must be a torch.Tensor or numpy array"),
])
def test_unsupported_tensors_are_refused_with_a_reason(bad, reason):
    with pytest.raises(T.TensorDigestError, match=reason):
        T.tensor_digest("x", bad)
    assert issubclass(T.TensorDigestError, CommitmentError)


@pytest.mark.parametrize("name", ["", None, 3, b"w"])
def test_tensor_names_must_be_strings(name):
    with pytest.raises(T.TensorDigestError, match="name"):
        T.tensor_digest(name, torch.zeros(1))


def state():
    return [
        ("param/w", rand(8, 4, seed=1)),
        ("param/b", rand(4, seed=2)),
        ("adam/exp_avg/w", rand(8, 4, seed=3)),
        ("adam/step", torch.tensor(12.0)),
        ("rng/key", np.array([1, 2, 3, 4], dtype=np.uint32)),
    ]


def test_state_digest_is_over_ordered_name_digest_pairs():
    items = state()
    expected = digest("pot/state/v1", [[n, T.tensor_digest(n, t)] for n, t in items])
    assert T.state_digest(items) == expected
    assert T.state_digest(items, max_workers=1) == expected
    assert T.state_digest(dict(items)) == expected
    assert T.state_digest_from_digests(T.tensor_digests(items)) == expected


def test_state_digest_order_and_content_matter():
    items = state()
    base = T.state_digest(items)
    assert T.state_digest(list(reversed(items))) != base
    swapped = [items[1], items[0], *items[2:]]
    assert T.state_digest(swapped) != base
    assert T.state_digest(items[:-1]) != base
    changed = list(items)
    changed[3] = ("adam/step", torch.tensor(13.0))
    assert T.state_digest(changed) != base
    renamed = list(items)
    renamed[1] = ("param/bias", items[1][1])
    assert T.state_digest(renamed) != base
    assert T.state_digest([]) == digest("pot/state/v1", [])


def test_state_digest_refuses_duplicates_and_malformed_entries():
    items = state()
    with pytest.raises(T.TensorDigestError, match="two tensors named 'param/w'"):
        T.state_digest([*items, ("param/w", torch.zeros(1))])
    with pytest.raises(T.TensorDigestError, match="entry 1 must be a"):
        T.state_digest([items[0], torch.zeros(1)])
    with pytest.raises(T.TensorDigestError, match="entry 0 has name"):
        T.state_digest([(5, torch.zeros(1))])
    with pytest.raises(T.TensorDigestError, match="ordered sequence"):
        T.state_digest(torch.zeros(3).numpy().tobytes())
    with pytest.raises(T.TensorDigestError, match="two tensors named 'a'"):
        T.state_digest_from_digests([("a", b"\x00" * 32), ("a", b"\x01" * 32)])
    with pytest.raises(T.TensorDigestError, match="32 bytes"):
        T.state_digest_from_digests([("a", b"\x00" * 31)])


def test_many_tensors_in_a_thread_pool_keep_their_order():
    items = [(f"t{i}", rand(i + 1, 17, seed=i)) for i in range(64)]
    pooled = T.tensor_digests(items, max_workers=4)
    assert [n for n, _ in pooled] == [n for n, _ in items]
    assert pooled == [(n, T.tensor_digest(n, t)) for n, t in items]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_digest_equals_cpu():
    t = rand(300, 200)
    assert T.tensor_digest("w", t.cuda()) == T.tensor_digest("w", t)
    assert T.tensor_digest("w", t.cuda().t()) == T.tensor_digest("w", t.t())
    key = bytes(range(32))
    assert T.keyed_tensor_digests([("w", t.cuda().t())], key) == T.keyed_tensor_digests([("w", t.t())], key)


def test_large_and_small_tensors_mixed_keep_order(monkeypatch):
    monkeypatch.setattr(T, "LARGE_TENSOR", 4096)  # 32x32 float32 and up count as large
    items = [(f"t{i}", rand(8 * (i % 5) + 1, 32, seed=i)) for i in range(20)]
    assert any(T._nbytes(t) >= 4096 for _, t in items) and any(T._nbytes(t) < 4096 for _, t in items)
    for workers in (1, 3):
        assert T.tensor_digests(items, max_workers=workers) == [(n, T.tensor_digest(n, t)) for n, t in items]


NUMPY_DTYPES = st.sampled_from(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                "uint32", "uint64", "float16", "float32", "float64"])


@settings(max_examples=60, deadline=None)
@given(NUMPY_DTYPES.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, max_side=6))),
       st.sampled_from(["C", "F", "reversed", "big-endian"]))
def test_digest_equals_the_reference_bytes_for_any_array(a, layout):
    name = "x"
    header = cbor.encode(["pot/tensor/v1", name, a.dtype.name, list(a.shape)])
    expected = blake3.blake3(header + a.astype(a.dtype.newbyteorder("<")).tobytes(order="C")).digest()
    if layout == "F":
        b = a.copy(order="F")
    elif layout == "reversed":
        b = a[::-1].copy()[::-1] if a.ndim else a  # negative strides
    else:
        b = a.astype(a.dtype.newbyteorder(">"))
    assert T.tensor_digest(name, b) == expected
    assert T.tensor_digest(name, torch.from_numpy(a.copy(order="C"))) == expected


# --- keyed digests (the witness's state proof) ----------------------------------------------------

KEY = bytes(range(32))


def test_keyed_digest_is_keyed_blake3_of_the_same_header_and_bytes():
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    header = cbor.encode(["pot/tensor/v1", "w", "float32", [2, 3]])
    ((name, d),) = T.keyed_tensor_digests([("w", a)], KEY)
    assert name == "w" and d == blake3.blake3(header + a.tobytes(), key=KEY).digest()


def test_keyed_digests_differ_from_unkeyed_and_between_keys():
    items = [("param/w", rand(4, 6)), ("opt/exp_avg/w", rand(4, 6, seed=1)), ("step", torch.tensor(3))]
    plain = T.tensor_digests(items)
    keyed = T.keyed_tensor_digests(items, KEY)
    other = T.keyed_tensor_digests(items, b"\x01" * 32)
    assert [n for n, _ in keyed] == [n for n, _ in plain] == [n for n, _ in items]
    for (_, p), (_, k), (_, o) in zip(plain, keyed, other, strict=True):
        assert len({p, k, o}) == 3
    assert T.keyed_tensor_digests(items, KEY) == keyed  # deterministic


def test_keyed_digests_take_the_same_paths_as_unkeyed(monkeypatch):
    # Pooled, large (multithreaded) and strided tensors give the same keyed digest as one by one.
    monkeypatch.setattr(T, "LARGE_TENSOR", 4096)
    items = [(f"t{i}", rand(8 * (i % 5) + 1, 32, seed=i)) for i in range(12)] + [("s", rand(40, 30).t())]
    one = [(n, T.keyed_tensor_digests([(n, t)], KEY)[0][1]) for n, t in items]
    for workers in (1, 3):
        assert T.keyed_tensor_digests(items, KEY, max_workers=workers) == one
    assert T.keyed_tensor_digests([("s", rand(40, 30).t().contiguous())], KEY)[0] == one[-1]


def test_keyed_digest_changes_with_one_bit():
    t = np.zeros(64, dtype=np.float32)
    base = T.keyed_tensor_digests([("w", t)], KEY)
    flipped = t.copy()
    flipped.view(np.uint32)[63] ^= 1
    assert T.keyed_tensor_digests([("w", flipped)], KEY) != base


@pytest.mark.parametrize("key", [b"", b"\x00" * 31, b"\x00" * 33, "k" * 32, None])
def test_keyed_digest_needs_a_32_byte_key(key):
    with pytest.raises(T.TensorDigestError, match="32-byte key"):
        T.keyed_tensor_digests([("w", np.zeros(2, dtype=np.float32))], key)  # type: ignore[arg-type]
