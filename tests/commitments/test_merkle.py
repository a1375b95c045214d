"""The RFC 9162 Merkle tree: published SHA-256 vectors, the RFC's recursive definitions, pymerkle,
and property tests for tampered or mismatched proofs."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitments import merkle as M
from commitments.errors import CommitmentError
from commitments.hashing import blake3

SHA = hashlib.sha256
MAX_N = 70
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def leaves_of(n: int) -> list[bytes]:
    return [b"leaf-%d" % i for i in range(n)]


# --- the RFC 9162 §2.1 definitions, written recursively over raw leaves (independent of the module)

def ref_mth(d: list[bytes], hash=SHA) -> bytes:
    if not d:
        return hash(b"").digest()
    if len(d) == 1:
        return hash(b"\x00" + d[0]).digest()
    k = 1
    while k * 2 < len(d):
        k *= 2
    return hash(b"\x01" + ref_mth(d[:k], hash) + ref_mth(d[k:], hash)).digest()


def ref_path(m: int, d: list[bytes], hash=SHA) -> list[bytes]:
    if len(d) == 1:
        return []
    k = 1
    while k * 2 < len(d):
        k *= 2
    if m < k:
        return ref_path(m, d[:k], hash) + [ref_mth(d[k:], hash)]
    return ref_path(m - k, d[k:], hash) + [ref_mth(d[:k], hash)]


def ref_subproof(m: int, d: list[bytes], b: bool, hash=SHA) -> list[bytes]:
    if m == len(d):
        return [] if b else [ref_mth(d, hash)]
    k = 1
    while k * 2 < len(d):
        k *= 2
    if m <= k:
        return ref_subproof(m, d[:k], b, hash) + [ref_mth(d[k:], hash)]
    return ref_subproof(m - k, d[k:], False, hash) + [ref_mth(d[:k], hash)]


# --- published vectors (Certificate Transparency reference tree, SHA-256)

CT_LEAVES = [bytes.fromhex(x) for x in [
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
    "606162636465666768696a6b6c6d6e6f"]]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
H_96 = "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"
H_5F = "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"
H_6B = "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"
H_BC = "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"
H_CA = "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"
H_0E = "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"


def hexes(proof: list[bytes]) -> list[str]:
    return [p.hex() for p in proof]


def test_empty_and_single_leaf_roots_follow_the_rfc_definitions():
    assert M.root([], hash=SHA).hex() == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    assert M.root([b"hello"], hash=SHA) == hashlib.sha256(b"\x00hello").digest()
    h0, h1 = hashlib.sha256(b"\x00a").digest(), hashlib.sha256(b"\x00b").digest()
    assert M.root([b"a", b"b"], hash=SHA) == hashlib.sha256(b"\x01" + h0 + h1).digest()
    # Three leaves: the split is 2 + 1, the lone right leaf is not paired with itself.
    h2 = hashlib.sha256(b"\x00c").digest()
    left = hashlib.sha256(b"\x01" + h0 + h1).digest()
    assert M.root([b"a", b"b", b"c"], hash=SHA) == hashlib.sha256(b"\x01" + left + h2).digest()
    assert M.leaf_hash(b"a", hash=SHA) == h0
    assert M.node_hash(h0, h1, hash=SHA) == left


def test_certificate_transparency_reference_roots():
    for n in range(1, 9):
        assert M.root(CT_LEAVES[:n], hash=SHA).hex() == CT_ROOTS[n - 1], n


@pytest.mark.parametrize("index,size,path", [
    (0, 8, [H_96, H_5F, H_6B]),
    (5, 8, [H_BC, H_CA, CT_ROOTS[3]]),
    (2, 3, [CT_ROOTS[1]]),
    (1, 5, [CT_ROOTS[0], H_5F, H_BC]),
    (0, 1, []),
])
def test_certificate_transparency_inclusion_vectors(index, size, path):
    leaves = CT_LEAVES[:size]
    assert hexes(M.inclusion_proof(leaves, index, hash=SHA)) == path
    assert M.verify_inclusion(leaves[index], index, size, [bytes.fromhex(p) for p in path],
                              bytes.fromhex(CT_ROOTS[size - 1]), hash=SHA)


@pytest.mark.parametrize("old,new,path", [
    (1, 1, []),
    (1, 8, [H_96, H_5F, H_6B]),
    (6, 8, [H_0E, H_CA, CT_ROOTS[3]]),
    (2, 5, [H_5F, H_BC]),
])
def test_certificate_transparency_consistency_vectors(old, new, path):
    assert hexes(M.consistency_proof(CT_LEAVES[:new], old, hash=SHA)) == path
    assert M.verify_consistency(old, new, bytes.fromhex(CT_ROOTS[old - 1]),
                                bytes.fromhex(CT_ROOTS[new - 1]), [bytes.fromhex(p) for p in path],
                                hash=SHA)


def test_every_size_and_index_matches_the_rfc_recursion():
    all_leaves = leaves_of(MAX_N)
    for n in range(0, MAX_N + 1):
        d = all_leaves[:n]
        r = M.root(d, hash=SHA)
        assert r == ref_mth(d)
        for i in range(n):
            assert M.inclusion_proof(d, i, hash=SHA) == ref_path(i, d)
        for m in range(1, n):
            assert M.consistency_proof(d, m, hash=SHA) == ref_subproof(m, d, True)


def test_blake3_tree_matches_the_rfc_recursion_with_blake3():
    d = leaves_of(23)
    assert M.root(d) == ref_mth(d, blake3)
    assert M.inclusion_proof(d, 17) == ref_path(17, d, blake3)
    assert M.consistency_proof(d, 13) == ref_subproof(13, d, True, blake3)
    assert M.root(d) != M.root(d, hash=SHA)


def test_against_pymerkle_sha256():
    pymerkle = pytest.importorskip("pymerkle")
    d = leaves_of(MAX_N)
    tree = pymerkle.InmemoryTree(algorithm="sha256")
    for leaf in d:
        tree.append_entry(leaf)
    for n in range(1, MAX_N + 1):
        r = M.root(d[:n], hash=SHA)
        assert tree.get_root(n) == r, n
        for i in range(n):
            # pymerkle's path starts with the leaf's own hash; the rest is the RFC audit path.
            theirs = tree.prove_inclusion(i + 1, n).path
            assert [bytes(x) for x in theirs] == [M.leaf_hash(d[i], SHA), *M.inclusion_proof(d[:n], i, SHA)]
        for m in range(1, n):
            # pymerkle's consistency paths have their own layout; its verifier must accept our roots.
            proof = tree.prove_consistency(m, n)
            proof.verify(M.root(d[:m], hash=SHA), r)
            assert M.verify_consistency(m, n, M.root(d[:m], hash=SHA), r,
                                        M.consistency_proof(d[:n], m, hash=SHA), hash=SHA)


def test_hash_variants_agree():
    d = leaves_of(37)
    hs = [M.leaf_hash(x) for x in d]
    assert M.root_from_hashes(hs) == M.root(d)
    assert M.root_from_hashes([]) == M.root([]) == M.empty_root() == blake3(b"").digest()
    for i in (0, 18, 36):
        assert M.inclusion_proof_from_hashes(hs, i) == M.inclusion_proof(d, i)
        assert M.verify_inclusion_hash(hs[i], i, 37, M.inclusion_proof(d, i), M.root(d))
    for m in (0, 1, 16, 20, 37):
        assert M.consistency_proof_from_hashes(hs, m) == M.consistency_proof(d, m)
    # a generator of leaves works as well as a list
    assert M.root(x for x in d) == M.root(d)


def test_large_leaf_is_hashed_without_concatenation_but_identically():
    big = bytes(range(256)) * 1024  # above the concatenation limit
    assert M.leaf_hash(big, SHA) == hashlib.sha256(b"\x00" + big).digest()
    assert M.leaf_hash(memoryview(big), SHA) == M.leaf_hash(bytearray(big), SHA)


# --- property tests: honest proofs verify, altered ones never do

def _tamper(proof: list[bytes], how: str, pos: int, byte: int, extra: bytes) -> list[bytes]:
    p = list(proof)
    if how == "flip":
        j = pos % len(p)
        b = bytearray(p[j])
        b[byte % len(b)] ^= 0x01
        p[j] = bytes(b)
    elif how == "drop":
        del p[pos % len(p)]
    elif how == "extra":
        p.insert(pos % (len(p) + 1), extra)
    elif how == "dup":
        j = pos % len(p)
        p.insert(j, p[j])
    elif how == "swap":
        j = pos % len(p)
        k = (j + 1) % len(p)
        p[j], p[k] = p[k], p[j]
    return p


@st.composite
def tree_and_index(draw):
    n = draw(st.integers(1, MAX_N))
    return n, draw(st.integers(0, n - 1))


@st.composite
def tree_and_old_size(draw):
    n = draw(st.integers(1, MAX_N))
    return n, draw(st.integers(0, n))


TAMPER = st.sampled_from(["flip", "drop", "extra", "dup", "swap"])


@PROPS
@given(tree_and_index(), TAMPER, st.integers(0, 200), st.integers(0, 31), st.binary(min_size=32, max_size=32))
def test_inclusion_tampering_is_rejected(ni, how, pos, byte, extra):
    n, i = ni
    d = leaves_of(n)
    r = M.root(d)
    proof = M.inclusion_proof(d, i)
    assert M.verify_inclusion(d[i], i, n, proof, r)
    if not proof and how in ("flip", "drop", "dup", "swap"):
        how = "extra"
    bad = _tamper(proof, how, pos, byte, extra)
    if bad != proof:
        assert not M.verify_inclusion(d[i], i, n, bad, r)
    assert not M.verify_inclusion(d[i] + b"x", i, n, proof, r)
    flipped_root = bytes([r[0] ^ 0x80]) + r[1:]
    assert not M.verify_inclusion(d[i], i, n, proof, flipped_root)


@PROPS
@given(tree_and_index(), st.integers(0, MAX_N + 5), st.integers(0, MAX_N + 5))
def test_inclusion_with_wrong_size_or_index(ni, other_size, other_index):
    n, i = ni
    d = leaves_of(MAX_N + 6)
    proof = M.inclusion_proof(d[:n], i)
    r = M.root(d[:n])
    if other_index != i:
        assert not M.verify_inclusion(d[i], other_index, n, proof, r)
    if other_size != n:
        # Against the genuine root of that size, the proof holds only if it is that tree's proof.
        genuine = i < other_size and M.inclusion_proof(d[:other_size], i) == proof
        assert M.verify_inclusion(d[i], i, other_size, proof, M.root(d[:other_size])) == genuine
        if i >= other_size:
            assert not M.verify_inclusion(d[i], i, other_size, proof, r)


@PROPS
@given(
    tree_and_old_size(), TAMPER, st.integers(0, 200), st.integers(0, 31), st.binary(min_size=32, max_size=32)
)
def test_consistency_tampering_is_rejected(nm, how, pos, byte, extra):
    n, m = nm
    d = leaves_of(n)
    old, new = M.root(d[:m]), M.root(d)
    proof = M.consistency_proof(d, m)
    assert M.verify_consistency(m, n, old, new, proof)
    if not proof and how in ("flip", "drop", "dup", "swap"):
        how = "extra"
    bad = _tamper(proof, how, pos, byte, extra)
    if bad != proof:
        assert not M.verify_consistency(m, n, old, new, bad)
    flip = bytes([new[0] ^ 1]) + new[1:]
    # The empty tree is a prefix of every tree, so only a non-empty old tree binds the new root.
    assert M.verify_consistency(m, n, old, flip, proof) == (m == 0)
    assert not M.verify_consistency(m, n, bytes([old[0] ^ 1]) + old[1:], new, proof)


@PROPS
@given(tree_and_old_size(), st.integers(0, MAX_N + 3), st.integers(0, MAX_N + 3))
def test_consistency_with_wrong_sizes(nm, other_old, other_new):
    n, m = nm
    d = leaves_of(MAX_N + 4)
    proof = M.consistency_proof(d[:n], m)
    if other_old != m and other_old <= n:
        genuine = M.consistency_proof(d[:n], other_old) == proof
        assert M.verify_consistency(other_old, n, M.root(d[:other_old]), M.root(d[:n]), proof) == genuine
    if other_new != n and other_new >= m:
        genuine = M.consistency_proof(d[:other_new], m) == proof
        assert M.verify_consistency(m, other_new, M.root(d[:m]), M.root(d[:other_new]), proof) == genuine
    if other_new < m:
        assert not M.verify_consistency(m, other_new, M.root(d[:m]), M.root(d[:n]), proof)


def test_consistency_of_different_histories_is_rejected():
    a, b = leaves_of(20), leaves_of(20)
    b[3] = b"rewritten"
    for m in range(1, 20):
        proof = M.consistency_proof(b, m)
        # Up to leaf 3 the two histories agree, so only those prefixes are consistent with b.
        assert M.verify_consistency(m, 20, M.root(a[:m]), M.root(b), proof) == (m <= 3)


def test_every_consistency_pair_verifies():
    d = leaves_of(MAX_N)
    roots = [M.root(d[:k]) for k in range(MAX_N + 1)]
    for n in range(MAX_N + 1):
        for m in range(n + 1):
            assert M.verify_consistency(m, n, roots[m], roots[n], M.consistency_proof(d[:n], m))


# --- malformed input: verification says False, building raises MerkleError

@pytest.mark.parametrize("args", [
    dict(leaf="str-leaf"),
    dict(index=-1), dict(index=True), dict(index=1.0), dict(index=5),
    dict(size=0), dict(size=-3), dict(size=1 << 70), dict(size="5"),
    dict(proof=None), dict(proof=b"x" * 64), dict(proof=["ab" * 16]),
    dict(proof=[b"\x00" * 31]), dict(proof=[b"\x00" * 32] * 200),
    dict(root=b"short"), dict(root=None),
])
def test_verify_inclusion_never_raises_on_garbage(args):
    d = leaves_of(5)
    good = dict(leaf=d[1], index=1, size=5, proof=M.inclusion_proof(d, 1), root=M.root(d))
    assert M.verify_inclusion(**good)
    assert M.verify_inclusion(**{**good, **args}) is False


@pytest.mark.parametrize("args", [
    dict(old_size=-1), dict(old_size=6), dict(new_size=2), dict(old_size=None),
    dict(new_size=1 << 64), dict(old_root=b""), dict(new_root="x" * 32),
    dict(proof=None), dict(proof=[None]), dict(proof=[b"\x01" * 33]), dict(proof=[]),
])
def test_verify_consistency_never_raises_on_garbage(args):
    d = leaves_of(5)
    good = dict(old_size=3, new_size=5, old_root=M.root(d[:3]), new_root=M.root(d),
                proof=M.consistency_proof(d, 3))
    assert M.verify_consistency(**good)
    assert M.verify_consistency(**{**good, **args}) is False


def test_empty_old_tree_and_equal_sizes():
    d = leaves_of(4)
    assert M.verify_consistency(0, 4, M.empty_root(), M.root(d), [])
    assert not M.verify_consistency(0, 4, M.root(d[:1]), M.root(d), [])
    assert M.verify_consistency(4, 4, M.root(d), M.root(d), [])
    assert not M.verify_consistency(4, 4, M.root(d), M.root(d), [M.root(d)])
    assert not M.verify_consistency(4, 4, M.root(d[:3]), M.root(d), [])


@pytest.mark.parametrize("call,reason", [
    (lambda: M.inclusion_proof(leaves_of(3), 3), "out of range"),
    (lambda: M.inclusion_proof(leaves_of(3), -1), "out of range"),
    (lambda: M.inclusion_proof([], 0), "out of range"),
    (lambda: M.inclusion_proof(leaves_of(3), "1"), "must be an int"),
    (lambda: M.consistency_proof(leaves_of(3), 4), "out of range"),
    (lambda: M.consistency_proof(leaves_of(3), -1), "out of range"),
    (lambda: M.root([b"a", "b"]), "leaf 1 must be bytes"),
    (lambda: M.root(b"abc"), "not a single byte string"),
    (lambda: M.root_from_hashes([b"\x00" * 31]), "must be 32 bytes"),
    (lambda: M.root([b"a"], hash=len), "hashlib-style constructor"),
])
def test_building_with_bad_arguments_raises_merkle_error(call, reason):
    with pytest.raises(M.MerkleError, match=reason):
        call()
    assert issubclass(M.MerkleError, CommitmentError)


# --- the append-only builder

@PROPS
@given(st.lists(st.binary(max_size=40), max_size=MAX_N))
def test_builder_root_equals_root_at_every_size(leaves):
    b = M.MerkleBuilder()
    assert b.root() == M.root([]) and b.size == 0
    for k, leaf in enumerate(leaves, 1):
        b.append(leaf)
        assert b.size == k
        assert b.root() == M.root(leaves[:k])
        assert len(b.frontier) == bin(k).count("1")


def test_builder_append_hash_and_sha256():
    d = leaves_of(50)
    b = M.MerkleBuilder(hash=SHA)
    for x in d:
        b.append_hash(M.leaf_hash(x, SHA))
    assert b.root() == M.root(d, hash=SHA)
    with pytest.raises(M.MerkleError, match="32 bytes"):
        b.append_hash(b"\x00" * 31)


def test_builder_resumes_from_its_serialised_frontier():
    d = leaves_of(100)
    b = M.MerkleBuilder()
    b.extend(d[:45])
    saved = b.to_cbor()
    restored = M.MerkleBuilder.from_cbor(saved)
    assert restored.size == 45 and restored.root() == b.root()
    restored.extend(d[45:])
    assert restored.root() == M.root(d)
    assert b.size == 45  # the original is untouched
    c = b.copy()
    c.append(b"other")
    assert b.size == 45 and c.size == 46


@pytest.mark.parametrize("mutate,reason", [
    (lambda s: {**s, "hash": "sha256"}, "made with hash"),
    (lambda s: {**s, "size": 47}, "for size 47 needs 5 frontier digests"),
    (lambda s: {**s, "size": -1}, "not an int"),
    (lambda s: {**s, "format": "x"}, "format"),
    (lambda s: {**s, "frontier": [b"\x00"] * 4}, "must be 32 bytes"),
    (lambda s: {k: v for k, v in s.items() if k != "size"}, "expected"),
    (lambda s: [s], "must be a dict"),
])
def test_builder_refuses_bad_saved_state(mutate, reason):
    b = M.MerkleBuilder()
    b.extend(leaves_of(45))
    with pytest.raises(M.MerkleError, match=reason):
        M.MerkleBuilder.from_dict(mutate(b.to_dict()))


def test_builder_state_records_the_hash():
    b = M.MerkleBuilder(hash=SHA)
    b.extend(leaves_of(3))
    with pytest.raises(M.MerkleError, match="made with hash 'sha256'"):
        M.MerkleBuilder.from_dict(b.to_dict())
    assert M.MerkleBuilder.from_dict(b.to_dict(), hash=SHA).root() == M.root(leaves_of(3), hash=SHA)


# --- the full tree kept by a prover

@pytest.mark.parametrize("hash", [blake3, SHA])
def test_full_tree_grown_by_appends_matches_bulk_build_and_functions(hash):
    d = leaves_of(MAX_N)
    grown = M.MerkleTree(hash=hash)
    assert grown.size == 0 and grown.root() == M.root([], hash=hash)
    for n in range(1, MAX_N + 1):
        grown.append(d[n - 1])
        bulk = M.MerkleTree.from_leaves(d[:n], hash=hash)
        assert grown.size == bulk.size == n
        assert grown.root() == bulk.root() == M.root(d[:n], hash=hash)
        for i in range(n):
            assert grown.inclusion_proof(i) == bulk.inclusion_proof(i) == ref_path(i, d[:n], hash)
        for m in range(1, n):
            assert (
                grown.consistency_proof(m) == bulk.consistency_proof(m) == ref_subproof(m, d[:n], True, hash)
            )
    assert grown.leaf_hash(7) == M.leaf_hash(d[7], hash)


def test_full_tree_refuses_bad_arguments():
    t = M.MerkleTree.from_leaves(leaves_of(5))
    for call, reason in [
        (lambda: t.inclusion_proof(5), "out of range"),
        (lambda: t.consistency_proof(6), "out of range"),
        (lambda: t.leaf_hash(-1), "out of range"),
        (lambda: t.append_hash(b"\x00"), "32 bytes"),
        (lambda: M.MerkleTree([b"\x00" * 32, b"short"]), "leaf hash 1 must be 32 bytes"),
    ]:
        with pytest.raises(M.MerkleError, match=reason):
            call()
    assert t.consistency_proof(0) == t.consistency_proof(5) == []
