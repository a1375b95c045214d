"""Philox4x32-10 known answers, an independent pure-Python cross-check, and the transforms."""

from __future__ import annotations

import math

import pytest
import torch

from oracle import rng

M32 = 0xFFFFFFFF


def philox_ref(ctr, key, rounds=10):
    """Straight from the Random123 definition, with Python's unbounded integers."""
    c = list(ctr)
    k0, k1 = key
    for _ in range(rounds):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


# Random123's published known-answer vectors for philox4x32 with 10 rounds.
KAT = [
    ([0, 0, 0, 0], (0, 0), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([M32] * 4, (M32, M32), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0),
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_known_answers(ctr, key, want):
    out = rng.philox4x32([torch.tensor([c], dtype=torch.int64) for c in ctr], key)
    assert [int(o) for o in out] == want
    assert philox_ref(ctr, key) == want


def test_matches_reference_on_random_counters():
    g = torch.Generator().manual_seed(7)  # only to pick test inputs
    ctr = torch.randint(0, 2**32, (4, 500), generator=g, dtype=torch.int64)
    key = (0x12345678, 0xFEDCBA98)
    out = torch.stack(rng.philox4x32(list(ctr), key))
    for j in range(500):
        assert [int(x) for x in out[:, j]] == philox_ref([int(x) for x in ctr[:, j]], key)


def test_keying_layout():
    seed, step, site = 0xAABBCCDD11223344, 9, rng.site_id("dropout/emb")
    words = rng.random_words(seed, step, "dropout/emb", (10,))
    for e in range(10):
        b = e // 4
        ref = philox_ref([b & M32, b >> 32, step, site], (seed & M32, seed >> 32))
        assert int(words[e]) == ref[e % 4]


def test_site_id_is_blake3_of_name():
    from commitments.hashing import digest

    assert rng.site_id("init/wte") == int.from_bytes(digest("pot/rng-site/v1", "init/wte")[:4], "little")
    assert rng.site_id("init/wte") != rng.site_id("init/wpe")


def test_offsets_continue_the_stream():
    full = rng.random_words(3, 1, "s", (37,))
    assert torch.equal(rng.random_words(3, 1, "s", (30,), offset=7), full[7:])
    nfull = rng.normal(3, 1, "s", (37,))
    assert torch.equal(rng.normal(3, 1, "s", (30,), offset=7).view(torch.int32), nfull[7:].view(torch.int32))
    m = rng.keep_mask(3, 1, "s", (37,), 0.3)
    assert torch.equal(rng.keep_mask(3, 1, "s", (6, 5), 0.3, offset=7).reshape(-1), m[7:])


def test_keys_separate_streams():
    a = rng.random_words(1, 1, "s", (64,))
    for other in (rng.random_words(2, 1, "s", (64,)), rng.random_words(1, 2, "s", (64,)),
                  rng.random_words(1, 1, "t", (64,)), rng.random_words(2**32 + 1, 1, "s", (64,))):
        assert not torch.equal(a, other)


def test_uniform_is_top_24_bits():
    w = rng.random_words(5, 0, "u", (1000,))
    u = rng.uniform(5, 0, "u", (1000,))
    assert u.dtype == torch.float32
    assert torch.equal(u.double(), (w >> 8).double() / 2**24)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0


def test_normal_transform_matches_box_muller_in_float64():
    seed, step, site = 11, 0, "init/x"
    n = 4000
    z = rng.normal(seed, step, site, (n,), std=0.5)
    site_n = rng.site_id(site)
    for e in range(0, n, 97):
        ref = philox_ref([e // 2, 0, step, site_n], (seed, 0))
        wa, wb = ref[2 * (e % 2)], ref[2 * (e % 2) + 1]
        u1, u2 = (wa + 1) * 2.0**-32, wb * 2.0**-32
        want = math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2) * 0.5
        assert abs(float(z[e]) - want) <= 1e-6 * max(1.0, abs(want))


def test_normal_statistics():
    z = rng.normal(1, 0, "stats", (200_000,)).double()
    assert abs(float(z.mean())) < 0.01
    assert abs(float(z.std()) - 1.0) < 0.01
    assert abs(float((z**4).mean()) - 3.0) < 0.1  # normal kurtosis, not uniform-like


def test_basic_op_log_and_cos_are_accurate():
    x = torch.linspace(1e-300, 1.0, 10001, dtype=torch.float64)[1:]
    x = torch.cat([x, torch.tensor([2.0**-32, 0.5, 1.0, 2.0**-1022, 1e300], dtype=torch.float64)])
    err = (rng.log64(x) - torch.log(x)).abs() / torch.log(x).abs().clamp_min(1.0)
    assert float(err.max()) < 4e-16
    u = torch.linspace(0, 1, 10001, dtype=torch.float64)
    assert float((rng.cos_2pi(u) - torch.cos(2 * math.pi * u)).abs().max()) < 2e-15
    exact = torch.tensor([0.0, 0.25, 0.5, 0.75], dtype=torch.float64)
    assert rng.cos_2pi(exact).tolist() == [1.0, 0.0, -1.0, 0.0]


def test_dropout_threshold_and_rate():
    assert rng.keep_threshold(0.0) == 0
    assert rng.keep_threshold(0.5) == 2**23
    m = rng.keep_mask(4, 3, "d", (100_000,), 0.1)
    assert m.dtype == torch.bool
    assert abs(float(m.float().mean()) - 0.9) < 0.005
    assert bool(rng.keep_mask(4, 3, "d", (1000,), 0.0).all())
    w = rng.random_words(4, 3, "d", (1000,))
    assert torch.equal(rng.keep_mask(4, 3, "d", (1000,), 0.1), (w >> 8) >= rng.keep_threshold(0.1))


@pytest.mark.parametrize("kwargs,msg", [
    (dict(seed=-1), "seed"), (dict(seed=2**64), "seed"), (dict(step=2**32), "step"),
    (dict(site=""), "site"),
])
def test_bad_arguments_are_refused(kwargs, msg):
    args = dict(seed=1, step=1, site="s") | kwargs
    with pytest.raises(rng.RngError, match=msg):
        rng.random_words(args["seed"], args["step"], args["site"], (4,))


def test_bad_dropout_probability():
    with pytest.raises(rng.RngError, match="dropout"):
        rng.keep_mask(1, 1, "s", (4,), 1.0)


# --- the compiled CPU pass against the eager definition ----------------------------------------

needs_numba = pytest.mark.skipif(not rng.kernels.enabled(), reason="the compiled RNG pass needs numba")


def bits32(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@needs_numba
@pytest.mark.parametrize("seed,step,site,shape,offset,std", [
    (11, 0, "init/x", (37,), 0, 1.0),
    (11, 0, "init/x", (30,), 7, 0.5),  # an odd offset starts inside a block
    (3, 1, "s", (1,), 0, 1.0),
    (3, 1, "s", (1,), 1, 1.0),  # one element: the second half of a block
    (0xAABBCCDD11223344, 2**32 - 1, "init/h.0.attn.c_attn.weight", (64, 33), 5, 0.02),
    (2**64 - 1, 9, 2**32 - 1, (2, 3, 5), 2**33 + 1, 0.0036084391824351613),  # high blocks, site ids
    (1337, 0, "init/wte", (300_001,), 0, 0.02),  # past the parallel threshold
])
def test_compiled_normal_equals_eager(seed, step, site, shape, offset, std):
    got = rng.normal(seed, step, site, shape, std=std, offset=offset)
    with rng.kernels.disabled():
        ref = rng.normal(seed, step, site, shape, std=std, offset=offset)
    assert got.shape == ref.shape == shape and got.dtype == torch.float32
    assert torch.equal(bits32(got), bits32(ref))


@needs_numba
def test_compiled_normal_equals_eager_with_the_compiled_sqrt():
    # the eager definition with the CPU sqrt kernel (what training used before the compiled pass)
    got = rng.normal(5, 0, "init/y", (4097,), std=0.02, offset=3)
    assert torch.equal(bits32(got), bits32(rng.normal_eager(5, 0, "init/y", (4097,), std=0.02, offset=3)))


@needs_numba
def test_compiled_box_muller_on_edge_words():
    # u1 at 2^-32 and 1 (log 0, so -0 under the sqrt); u2 on and around the quadrant boundaries
    # 0, 1/8, 1/4, 1/2, 3/4 and 1 - 2^-32, where round-half-even and the quadrant select decide.
    edges_a = [0, 1, 2, 3, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
    q = 2**30
    edges_b = sorted({v + d for v in (0, q // 2, q, 2 * q, 3 * q, 4 * q - 1, 5 * q // 2, 7 * q // 2)
                      for d in (-1, 0, 1) if 0 <= v + d < 2**32})
    g = torch.Generator().manual_seed(3)
    rand = torch.randint(0, 2**32, (2, 20_000), generator=g, dtype=torch.int64)
    wa = torch.cat([torch.tensor(edges_a).repeat_interleave(len(edges_b)), rand[0]])
    wb = torch.cat([torch.tensor(edges_b).repeat(len(edges_a)), rand[1]])
    for std in (1.0, 0.02, 3.0e-39, 1e38):  # a subnormal and a huge scale: the final rounding
        got = rng.box_muller_compiled(wa, wb, std)
        with rng.kernels.disabled():
            ref = rng.box_muller(wa, wb, std)
        assert torch.equal(bits32(got), bits32(ref)), std


def test_eager_normal_runs_with_the_kernels_off():
    with rng.kernels.disabled():
        z = rng.normal(1, 0, "stats", (1000,))
    assert torch.equal(bits32(z), bits32(rng.normal_eager(1, 0, "stats", (1000,))))


@needs_numba
@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86 mnemonic scan")
def test_compiled_rng_pass_has_no_fused_multiply_add():
    import numba

    fma = ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")
    ctl = numba.njit(fastmath=True)(lambda a, b, c: a * b + c)
    ctl(1.0, 2.0, 3.0)
    if not any(m in ctl.inspect_asm(ctl.signatures[0]) for m in fma):
        pytest.skip("this CPU has no FMA instructions to look for")
    rng.normal(1, 0, "s", (8,))
    rng.box_muller_compiled(torch.tensor([1, 2]), torch.tensor([3, 4]))
    for k in (rng._normal_k, rng._box_muller_k):
        fresh = numba.njit(nogil=True, error_model="numpy")(k.py_func)  # uncached and serial
        for sig in k.signatures:
            fresh.compile(sig)
            asm = fresh.inspect_asm(sig).lower()
            assert "mulsd" in asm or "mulpd" in asm, "no float64 arithmetic found; the scan is blind"
            assert "sqrtsd" in asm or "sqrtpd" in asm
            for m in fma:
                assert m not in asm, f"{k.__name__}: {m} in the machine code"
