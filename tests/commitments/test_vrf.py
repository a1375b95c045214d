"""commitments.vrf, ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381 suite 0x03): the RFC's Appendix B.3
examples bit for bit (with their intermediate values), the properties a VRF must have, the
Python point arithmetic against libsodium's, RFC 9381's acceptance of points outside the
prime-order subgroup, and one coded refusal for every kind of malformed key or proof."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.bindings import (
    crypto_core_ed25519_add,
    crypto_core_ed25519_is_valid_point,
    crypto_scalarmult_ed25519_base_noclamp,
    crypto_scalarmult_ed25519_noclamp,
)

from commitments import vrf
from commitments.errors import CommitmentError

VECTORS = json.loads((Path(__file__).parent / "vectors" / "ecvrf_tai.json").read_text())["vectors"]
# --- an independent reference: RFC 8032's point decoding and arithmetic in Python integers ---

_D = (-121665 * pow(121666, vrf.P - 2, vrf.P)) % vrf.P
_SQRT_M1 = pow(2, (vrf.P - 1) // 4, vrf.P)
_ID = (0, 1, 1, 0)


def _add(p1, p2):
    """Extended-coordinate addition (RFC 8032 §5.1.4); complete, so it also doubles."""
    p = vrf.P
    x1, y1, z1, t1 = p1
    x2, y2, z2, t2 = p2
    a = (y1 - x1) * (y2 - x2) % p
    b = (y1 + x1) * (y2 + x2) % p
    c = 2 * _D * t1 * t2 % p
    d = 2 * z1 * z2 % p
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % p, g * h % p, f * g % p, e * h % p)


def _mul(k, point):
    result, addend = _ID, point
    while k:
        if k & 1:
            result = _add(result, addend)
        addend = _add(addend, addend)
        k >>= 1
    return result


def _decode(data):
    """RFC 8032 §5.1.3, or None."""
    p = vrf.P
    n = int.from_bytes(data, "little")
    sign, y = n >> 255, n & ((1 << 255) - 1)
    if y >= p:
        return None
    u, v = (y * y - 1) % p, (_D * y * y + 1) % p
    x = u * pow(v, 3, p) * pow(u * pow(v, 7, p), (p - 5) // 8, p) % p
    if v * x * x % p == (-u) % p:
        x = x * _SQRT_M1 % p
    elif v * x * x % p != u:
        return None
    if x == 0 and sign:
        return None
    if x & 1 != sign:
        x = p - x
    return (x, y, 1, x * y % p)


def _encode(point):
    x, y, z, _ = point
    zi = pow(z, vrf.P - 2, vrf.P)
    x, y = x * zi % vrf.P, y * zi % vrf.P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


IDENTITY = vrf._IDENTITY_BYTES

_secrets = st.binary(min_size=32, max_size=32)
_alphas = st.binary(max_size=80)

# The point of order 2, (0, -1), and a point of order 8 (its encoding is one of libsodium's
# small-order blocklist): both are on the curve, neither in the prime-order subgroup.
ORDER_2 = (vrf.P - 1).to_bytes(32, "little")


def _order_8_point() -> bytes:
    for i in range(1000):
        candidate = _decode(hashlib.sha256(b"torsion %d" % i).digest())
        if candidate is None:
            continue
        torsion = _mul(vrf.L, candidate)  # kills the prime-order part
        if _encode(_mul(4, torsion)) != IDENTITY:
            return _encode(torsion)
    raise AssertionError("no point of order 8 found")


ORDER_8 = _order_8_point()


def _no_x() -> bytes:
    """32 bytes with y < p for which no x exists: not a point."""
    for y in range(2, 1000):
        data = y.to_bytes(32, "little")
        if _decode(data) is None:
            return data
    raise AssertionError("every small y had an x")


NOT_A_POINT = _no_x()
Y_NOT_BELOW_P = (vrf.P + 3).to_bytes(32, "little")  # y = 3 written non-canonically


@pytest.mark.parametrize("tv", VECTORS, ids=lambda tv: f"example{tv['example']}")
def test_rfc9381_appendix_b3(tv):
    sk = vrf.keygen(bytes.fromhex(tv["sk"]))
    alpha = bytes.fromhex(tv["alpha"])
    assert sk.public_key.hex() == tv["pk"] == vrf.public_key(bytes.fromhex(tv["sk"])).hex()
    clamped = bytearray(hashlib.sha512(bytes.fromhex(tv["sk"])).digest()[:32])
    clamped[0] &= 248
    clamped[31] = (clamped[31] & 127) | 64
    assert clamped.hex() == tv["x"]
    assert int.from_bytes(sk._x, "little") == int.from_bytes(clamped, "little") % vrf.L
    # encode_to_curve: the counters below ctr give no point, ctr gives one, and H is 8 times it.
    h = vrf.encode_to_curve(sk.public_key, alpha)
    assert h.hex() == tv["H"]
    for ctr in range(tv["ctr"] + 1):
        digest = hashlib.sha512(b"\x03\x01" + sk.public_key + alpha + bytes([ctr]) + b"\x00").digest()
        assert (_decode(digest[:32]) is not None) == (ctr == tv["ctr"])
    k_string = hashlib.sha512(sk._prefix + h).digest()
    assert k_string.hex() == tv["k"]
    k = vrf.nonce(sk._prefix, h)
    assert k == int.from_bytes(k_string, "little") % vrf.L
    assert crypto_scalarmult_ed25519_base_noclamp(k.to_bytes(32, "little")).hex() == tv["U"]
    assert crypto_scalarmult_ed25519_noclamp(k.to_bytes(32, "little"), h).hex() == tv["V"]
    pi = vrf.prove(sk, alpha)
    assert pi.hex() == tv["pi"]
    assert vrf.proof_to_hash(pi).hex() == tv["beta"]
    assert vrf.verify(bytes.fromhex(tv["pk"]), alpha, bytes.fromhex(tv["pi"])).hex() == tv["beta"]
    gamma, c, s = pi[:32], int.from_bytes(pi[32:48], "little"), int.from_bytes(pi[48:], "little")
    assert c == vrf.challenge(sk.public_key, h, gamma, bytes.fromhex(tv["U"]), bytes.fromhex(tv["V"]))
    assert s < vrf.L


@settings(max_examples=40, deadline=None)
@given(_secrets, _alphas)
def test_a_proof_verifies_under_its_key_and_gives_its_hash(secret, alpha):
    sk = vrf.keygen(secret)
    pi = vrf.prove(sk, alpha)
    assert len(pi) == vrf.PROOF_BYTES
    beta = vrf.verify(sk.public_key, alpha, pi)
    assert beta == vrf.proof_to_hash(pi) and len(beta) == vrf.BETA_BYTES
    # Uniqueness: prove is deterministic, from the key object or from the secret's bytes.
    assert vrf.prove(secret, alpha) == pi == vrf.prove(bytearray(secret), memoryview(alpha))


@settings(max_examples=40, deadline=None)
@given(_secrets, _secrets, _alphas)
def test_a_proof_for_one_key_never_verifies_under_another(secret, other, alpha):
    if vrf.keygen(secret).public_key == vrf.keygen(other).public_key:
        return
    pi = vrf.prove(secret, alpha)
    with pytest.raises(vrf.VRFProofInvalid):
        vrf.verify(vrf.public_key(other), alpha, pi)


@settings(max_examples=60, deadline=None)
@given(_secrets, _alphas, st.integers(0, vrf.PROOF_BYTES * 8 - 1))
def test_any_bit_flip_of_the_proof_is_refused(secret, alpha, bit):
    sk = vrf.keygen(secret)
    pi = bytearray(vrf.prove(sk, alpha))
    pi[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(vrf.VRFError):
        vrf.verify(sk.public_key, alpha, bytes(pi))


@settings(max_examples=40, deadline=None)
@given(_secrets, _alphas.filter(len), st.data())
def test_any_bit_flip_of_alpha_is_refused(secret, alpha, data):
    bit = data.draw(st.integers(0, len(alpha) * 8 - 1))
    sk = vrf.keygen(secret)
    pi = vrf.prove(sk, alpha)
    flipped = bytearray(alpha)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(vrf.VRFProofInvalid):
        vrf.verify(sk.public_key, bytes(flipped), pi)


def test_beta_differs_across_alphas_and_keys():
    keys = [vrf.keygen(bytes([i]) * 32) for i in range(4)]
    betas = {vrf.verify(k.public_key, a, vrf.prove(k, a)) for k in keys for a in (b"", b"a", b"b")}
    assert len(betas) == 12


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=32, max_size=32))
def test_libsodium_doubling_decodes_exactly_as_rfc8032(data):
    # _cofactor_times (libsodium's point addition, plus the two pre-checks) against the Python
    # RFC 8032 decoding and multiplication: the same points accepted, the same 8P.
    py = _decode(data)
    got = vrf._cofactor_times(data)
    assert (got is None) == (py is None)
    if py is not None:
        assert got == _encode(_mul(8, py))


@pytest.mark.parametrize(
    "data",
    [IDENTITY, ORDER_2, ORDER_8, NOT_A_POINT, Y_NOT_BELOW_P,
     (1 | 1 << 255).to_bytes(32, "little"), (vrf.P - 1 | 1 << 255).to_bytes(32, "little"),
     (2**255 - 1).to_bytes(32, "little"), bytes(32)],
    ids=["identity", "order2", "order8", "no-x", "y-not-below-p", "x0-sign1", "y-1-sign1", "all-ones",
         "zero"],
)
def test_edge_encodings_decode_as_rfc8032_says(data):
    py = _decode(data)
    assert (vrf._cofactor_times(data) is None) == (py is None)
    if py is not None:
        assert vrf._cofactor_times(data) == _encode(_mul(8, py))


@settings(max_examples=30, deadline=None)
@given(_secrets, st.integers(0, 2**255 - 1))
def test_python_scalar_multiplication_matches_libsodium(secret, k):
    point = vrf.public_key(secret)
    decoded = _decode(point)
    assert decoded is not None
    assert _encode(decoded) == point
    want = (IDENTITY if k % vrf.L == 0
            else crypto_scalarmult_ed25519_noclamp(k.to_bytes(32, "little"), point))
    assert _encode(_mul(k, decoded)) == want
    assert vrf._times(k, vrf._multiples(point)) == want
    assert vrf._times(0, vrf._multiples(point)) == IDENTITY


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.integers(0, 2**255 - 1))
def test_multiples_give_k_times_any_curve_point(data, k):
    # Any point, mostly outside the prime-order subgroup (where libsodium will not multiply):
    # (k >> 3) * 8P + (k mod 8) * P from libsodium equals k * P from the Python reference.
    point = _decode(data)
    multiples = vrf._multiples(data)
    if point is None:
        assert multiples is None
        return
    assert multiples is not None
    assert list(multiples) == [_encode(_mul(m, point)) for m in (1, 2, 4, 8)]
    assert vrf._times(k, multiples) == _encode(_mul(k, point))
    assert vrf._times(k % 8, multiples) == _encode(_mul(k % 8, point))


def _torsioned_proof(sk: vrf.SecretKey, alpha: bytes, torsion: bytes, on_key: bool) -> tuple[bytes, bytes]:
    """A proof that RFC 9381 verify accepts with a point outside the prime-order subgroup: Gamma
    (or the public key) plus a point of order 2. Anyone holding the secret can make one, trying
    nonces until the challenge's parity matches the torsion they put in U or V."""
    x = int.from_bytes(sk._x, "little")
    y = crypto_core_ed25519_add(sk.public_key, torsion) if on_key else sk.public_key
    h = vrf.encode_to_curve(y, alpha)
    gamma = crypto_scalarmult_ed25519_noclamp(sk._x, h)
    if not on_key:
        gamma = crypto_core_ed25519_add(gamma, torsion)
    for attempt in range(200):
        k = int.from_bytes(hashlib.sha512(b"nonce %d" % attempt).digest(), "little") % vrf.L
        parity = attempt % 2
        u = crypto_scalarmult_ed25519_base_noclamp(k.to_bytes(32, "little"))
        v = crypto_scalarmult_ed25519_noclamp(k.to_bytes(32, "little"), h)
        shift = vrf._times(parity, vrf._multiples(torsion))
        if on_key:
            u = vrf._sub(u, shift)  # s*B - c*(Y + T) = k*B - (c mod 2)*T
        else:
            v = vrf._sub(v, shift)  # s*H - c*(Gamma + T) = k*H - (c mod 2)*T
        c = vrf.challenge(y, h, gamma, u, v)
        if c % 2 == parity:
            s = (k + c * x) % vrf.L
            return y, gamma + c.to_bytes(16, "little") + s.to_bytes(32, "little")
    raise AssertionError("no nonce gave the parity")


@pytest.mark.parametrize("on_key", [False, True], ids=["gamma", "public-key"])
def test_points_outside_the_subgroup_verify_as_rfc9381_says(on_key):
    sk = vrf.keygen(b"\x07" * 32)
    y, pi = _torsioned_proof(sk, b"torsion", ORDER_2, on_key)
    point = y if on_key else pi[:32]
    assert not crypto_core_ed25519_is_valid_point(point)  # libsodium refuses it: Python path
    beta = vrf.verify(y, b"torsion", pi)
    assert beta == vrf.proof_to_hash(pi)
    if not on_key:
        # The cofactor in proof_to_hash makes beta the honest proof's: uniqueness holds.
        assert beta == vrf.proof_to_hash(vrf.prove(sk, b"torsion"))
    with pytest.raises(vrf.VRFProofInvalid):
        vrf.verify(y, b"other alpha", pi)


def _valid() -> tuple[bytes, bytes, bytes]:
    sk = vrf.keygen(b"\x01" * 32)
    return sk.public_key, b"alpha", vrf.prove(sk, b"alpha")


def _with(pi: bytes, start: int, part: bytes) -> bytes:
    return pi[:start] + part + pi[start + len(part):]


PK, ALPHA, PI = _valid()
REFUSALS = [
    ("pk-str", "x" * 32, ALPHA, PI, vrf.VRFInputType),
    ("alpha-int", PK, 5, PI, vrf.VRFInputType),
    ("pi-none", PK, ALPHA, None, vrf.VRFInputType),
    ("pk-short", PK[:31], ALPHA, PI, vrf.VRFPublicKeyLength),
    ("pk-long", PK + b"\x00", ALPHA, PI, vrf.VRFPublicKeyLength),
    ("pi-empty", PK, ALPHA, b"", vrf.VRFProofLength),
    ("pi-short", PK, ALPHA, PI[:79], vrf.VRFProofLength),
    ("pi-long", PK, ALPHA, PI + b"\x00", vrf.VRFProofLength),
    ("pk-no-x", NOT_A_POINT, ALPHA, PI, vrf.VRFPublicKeyNotPoint),
    ("pk-y-not-below-p", Y_NOT_BELOW_P, ALPHA, PI, vrf.VRFPublicKeyNotPoint),
    ("pk-x0-sign1", (1 | 1 << 255).to_bytes(32, "little"), ALPHA, PI, vrf.VRFPublicKeyNotPoint),
    ("pk-identity", IDENTITY, ALPHA, PI, vrf.VRFPublicKeySmallOrder),
    ("pk-order-2", ORDER_2, ALPHA, PI, vrf.VRFPublicKeySmallOrder),
    ("pk-order-8", ORDER_8, ALPHA, PI, vrf.VRFPublicKeySmallOrder),
    ("gamma-no-x", PK, ALPHA, _with(PI, 0, NOT_A_POINT), vrf.VRFGammaNotPoint),
    ("gamma-y-not-below-p", PK, ALPHA, _with(PI, 0, Y_NOT_BELOW_P), vrf.VRFGammaNotPoint),
    ("s-is-L", PK, ALPHA, _with(PI, 48, vrf.L.to_bytes(32, "little")), vrf.VRFScalarNotReduced),
    ("s-all-ones", PK, ALPHA, _with(PI, 48, b"\xff" * 32), vrf.VRFScalarNotReduced),
    ("c-flipped", PK, ALPHA, _with(PI, 32, bytes([PI[32] ^ 1])), vrf.VRFProofInvalid),
    ("gamma-identity", PK, ALPHA, _with(PI, 0, IDENTITY), vrf.VRFProofInvalid),
    ("gamma-order-8", PK, ALPHA, _with(PI, 0, ORDER_8), vrf.VRFProofInvalid),
    ("c-zero-s-zero", PK, ALPHA, _with(PI, 32, bytes(48)), vrf.VRFProofInvalid),
    ("all-zero", bytes(32), b"", bytes(80), vrf.VRFPublicKeySmallOrder),  # y = 0: order 4
]


@pytest.mark.parametrize(("name", "pk", "alpha", "pi", "error"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_every_malformed_input_has_its_coded_refusal(name, pk, alpha, pi, error):
    with pytest.raises(error) as caught:
        vrf.verify(pk, alpha, pi)
    assert type(caught.value) is error
    assert isinstance(caught.value, CommitmentError) and caught.value.code == error.code
    assert str(caught.value)  # a reason a person can read


def test_proof_to_hash_refuses_what_it_cannot_decode():
    for pi, error in [(PI[:40], vrf.VRFProofLength), (_with(PI, 0, NOT_A_POINT), vrf.VRFGammaNotPoint),
                      (_with(PI, 48, b"\xff" * 32), vrf.VRFScalarNotReduced), ("pi", vrf.VRFInputType)]:
        with pytest.raises(error):
            vrf.proof_to_hash(pi)


def test_keys_refuse_bad_secrets_and_hide_them():
    with pytest.raises(vrf.VRFSecretKeyLength):
        vrf.keygen(b"\x00" * 31)
    with pytest.raises(vrf.VRFInputType):
        vrf.keygen("0" * 32)
    secret = os.urandom(32)
    sk = vrf.keygen(secret)
    assert secret.hex() not in repr(sk) and sk.public_key.hex() in repr(sk)
    assert vrf.validate_key(sk.public_key) == sk.public_key
    with pytest.raises(vrf.VRFPublicKeySmallOrder):
        vrf.validate_key(ORDER_8)


def test_refusal_codes_are_stable_and_distinct():
    errors = [vrf.VRFInputType, vrf.VRFSecretKeyLength, vrf.VRFPublicKeyLength, vrf.VRFPublicKeyNotPoint,
              vrf.VRFPublicKeySmallOrder, vrf.VRFProofLength, vrf.VRFGammaNotPoint, vrf.VRFScalarNotReduced,
              vrf.VRFProofInvalid, vrf.VRFEncodeToCurveExhausted]
    assert [e.code for e in errors] == [
        "VRFInputType", "VRFSecretKeyLength", "VRFPublicKeyLength", "VRFPublicKeyNotPoint",
        "VRFPublicKeySmallOrder", "VRFProofLength", "VRFGammaNotPoint", "VRFScalarNotReduced",
        "VRFProofInvalid", "VRFEncodeToCurveExhausted",
    ]
    assert all(issubclass(e, vrf.VRFError) for e in errors)


def test_the_benchmark_prints_consistent_figures():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, str(root / "bench" / "vrf.py"), "--calls", "5", "--per-block", "200", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    got = json.loads(out)
    assert got["block_seconds"] == 6 and got["per_block"] == 200
    assert got["prove_us_cpu"] > 0 and got["verify_us_cpu"] > 0 and got["libsodium_mult_us_cpu"] > 0
    assert got["hostile_verify_us_cpu"] > 0
    assert got["core_share_cpu"] == pytest.approx(200 * got["verify_us_cpu"] / 1e6 / 6, rel=0.01)
