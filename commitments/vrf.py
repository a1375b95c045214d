"""ECVRF-EDWARDS25519-SHA512-TAI, the RFC 9381 verifiable random function of suite 0x03.

A VRF is a keyed hash whose output anyone holding the public key can check: `prove(key, alpha)`
gives an 80-byte proof `pi`, `proof_to_hash(pi)` its 64-byte output `beta`, and
`verify(public_key, alpha, pi)` returns that `beta` only if `pi` was made with the secret key for
`alpha`. For one key and one `alpha` there is exactly one `beta` (uniqueness), which is what a
self-selected committee needs: a member cannot grind its draw.

Every group operation runs in libsodium (through PyNaCl's bindings): fixed-base and variable-base
scalar multiplication without clamping, point addition and subtraction, and the scalar arithmetic
mod L. libsodium multiplies only points of the prime-order subgroup, but RFC 9381 reads any point
of the curve: encode_to_curve's candidates are generally outside that subgroup, and a hostile key
or proof may be. Point addition decodes any curve point, so such a point P is handled through
its multiples P, 2P, 4P, 8P (three doublings; 8P is in the subgroup): k*P = (k >> 3)*(8P) plus
(k mod 8)*P from the first three. Python integers only check the two encodings that libsodium's
decoding accepts and RFC 8032 §5.1.3 refuses (y not below p; x = 0 with the sign bit set).

Untrusted input: `verify` and `proof_to_hash` take anything, read only the fixed-size key and
proof (plus `alpha`, which is only hashed), and refuse with a `VRFError` subclass whose `code` is
stable. Every input costs at most a few libsodium multiplications, hostile or not. Secret scalars
only meet libsodium's constant-time code.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

from nacl.bindings import (
    crypto_core_ed25519_add,
    crypto_core_ed25519_scalar_add,
    crypto_core_ed25519_scalar_mul,
    crypto_core_ed25519_scalar_reduce,
    crypto_core_ed25519_sub,
    crypto_scalarmult_ed25519_base_noclamp,
    crypto_scalarmult_ed25519_noclamp,
)
from nacl.exceptions import RuntimeError as SodiumError

from commitments.errors import CommitmentError

SUITE = b"\x03"  # ECVRF-EDWARDS25519-SHA512-TAI
SECRET_KEY_BYTES = 32
PUBLIC_KEY_BYTES = 32
PROOF_BYTES = 80  # Gamma (32) || c (16) || s (32)
BETA_BYTES = 64
C_BYTES = 16
MAX_CTR = 255  # encode_to_curve's counter is one byte

# edwards25519 (RFC 8032 §5.1): -x^2 + y^2 = 1 + d x^2 y^2 over GF(p), a subgroup of prime order L.
P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
COFACTOR = 8

_IDENTITY_BYTES = (1).to_bytes(32, "little")


class VRFError(CommitmentError):
    """A VRF input refused; `code` names the check that refused it and never changes."""

    code: ClassVar[str] = "VRFRefused"


class VRFInputType(VRFError):
    """A key, proof or alpha that is not bytes (bytes, bytearray or memoryview)."""

    code = "VRFInputType"


class VRFSecretKeyLength(VRFError):
    """A secret key that is not 32 bytes."""

    code = "VRFSecretKeyLength"


class VRFPublicKeyLength(VRFError):
    """A public key that is not 32 bytes."""

    code = "VRFPublicKeyLength"


class VRFPublicKeyNotPoint(VRFError):
    """A public key that does not decode as an edwards25519 point (RFC 8032 §5.1.3)."""

    code = "VRFPublicKeyNotPoint"


class VRFPublicKeySmallOrder(VRFError):
    """A public key of order 1, 2, 4 or 8: refused by ECVRF_validate_key (RFC 9381 §5.4.5)."""

    code = "VRFPublicKeySmallOrder"


class VRFProofLength(VRFError):
    """A proof that is not 80 bytes."""

    code = "VRFProofLength"


class VRFGammaNotPoint(VRFError):
    """A proof whose first 32 bytes (Gamma) do not decode as an edwards25519 point."""

    code = "VRFGammaNotPoint"


class VRFScalarNotReduced(VRFError):
    """A proof whose last 32 bytes (s) are not below the group order L (RFC 9381 §5.4.4)."""

    code = "VRFScalarNotReduced"


class VRFProofInvalid(VRFError):
    """A well-formed proof whose challenge does not match: not made with this key for this alpha."""

    code = "VRFProofInvalid"


class VRFEncodeToCurveExhausted(VRFError):
    """No counter 0..255 gave a curve point (probability about 2^-256: a sign of a broken hash)."""

    code = "VRFEncodeToCurveExhausted"


# --- group operations on encoded points, in libsodium ---


def _scalar_bytes(k: int) -> bytes:
    return k.to_bytes(32, "little")


def _h_times(k: int, h_string: bytes) -> bytes:
    """k * H for 0 <= k < 2^255, H from encode_to_curve: 8 times a curve point, so a point of the
    prime-order subgroup, which libsodium multiplies; when H is the identity or k is 0 mod L
    (probability about 2^-250 each) libsodium refuses, and the product is the identity."""
    if h_string != _IDENTITY_BYTES and k % L:
        return crypto_scalarmult_ed25519_noclamp(_scalar_bytes(k), h_string)
    return _IDENTITY_BYTES


def _smul_base(k: int) -> bytes:
    """k * B, encoded, for 0 <= k < L (k secret or public: libsodium's constant-time code)."""
    if k == 0:
        return _IDENTITY_BYTES
    return crypto_scalarmult_ed25519_base_noclamp(_scalar_bytes(k))


def _sub(a: bytes, b: bytes) -> bytes:
    """a - b for two canonically encoded curve points (libsodium checks only that they are on it)."""
    return crypto_core_ed25519_sub(a, b)


def _multiples(data: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """(P, 2P, 4P, 8P) for the point P that 32 bytes encode (RFC 8032 §5.1.3), or None if they
    encode none.

    Doublings with crypto_core_ed25519_add, which decodes any point on the curve (in the
    prime-order subgroup or not) and fails when the bytes have no x; the two cases where its
    decoding is laxer than RFC 8032 (y not below p, and x = 0 with the sign bit set, which only
    y = 1 and y = -1 can give) are refused here first. tests/commitments/test_vrf.py checks this
    against a Python RFC 8032 decoder and its arithmetic."""
    n = int.from_bytes(data, "little")
    y = n & ((1 << 255) - 1)
    if y >= P or (n >> 255 and y in (1, P - 1)):
        return None
    try:
        two = crypto_core_ed25519_add(data, data)
    except SodiumError:
        return None
    four = crypto_core_ed25519_add(two, two)
    return data, two, four, crypto_core_ed25519_add(four, four)


def _cofactor_times(data: bytes) -> bytes | None:
    """8 * the point that 32 bytes encode, or None if they encode none (see `_multiples`)."""
    multiples = _multiples(data)
    return None if multiples is None else multiples[3]


def _times(k: int, multiples: tuple[bytes, bytes, bytes, bytes]) -> bytes:
    """k * P for 0 <= k < 2^255 and any curve point P, from (P, 2P, 4P, 8P): (k >> 3) * 8P, where
    8P is in the prime-order subgroup (libsodium multiplies it), plus (k mod 8) * P as a sum of
    P, 2P and 4P. The same group element as k * P whether or not P is in the subgroup."""
    q = (k >> 3) % L
    eight = multiples[3]
    total = _IDENTITY_BYTES
    if q and eight != _IDENTITY_BYTES:
        total = crypto_scalarmult_ed25519_noclamp(_scalar_bytes(q), eight)
    for bit in range(3):
        if k >> bit & 1:
            total = crypto_core_ed25519_add(total, multiples[bit])
    return total


# --- RFC 9381 §5.4 building blocks for suite 0x03 ---


def encode_to_curve(salt: bytes, alpha: bytes) -> bytes:
    """ECVRF_encode_to_curve_try_and_increment (RFC 9381 §5.4.1.1) with salt = the public key:
    SHA-512 of suite || 0x01 || salt || alpha || ctr || 0x00, its first 32 bytes read as a point
    (RFC 8032 §5.1.3), the first counter that gives one, times the cofactor 8."""
    for ctr in range(MAX_CTR + 1):
        digest = hashlib.sha512(SUITE + b"\x01" + salt + alpha + bytes([ctr]) + b"\x00").digest()
        point = _cofactor_times(digest[:32])
        if point is not None:
            return point
    raise VRFEncodeToCurveExhausted(
        f"encode_to_curve found no curve point for counters 0..{MAX_CTR} (alpha of {len(alpha)} bytes)"
    )


def nonce(prefix: bytes, h_string: bytes) -> int:
    """ECVRF_nonce_generation_RFC8032 (RFC 9381 §5.4.2.2): SHA-512(prefix || H) mod L."""
    reduced = crypto_core_ed25519_scalar_reduce(hashlib.sha512(prefix + h_string).digest())
    return int.from_bytes(reduced, "little")


def challenge(*points: bytes) -> int:
    """ECVRF_challenge_generation (RFC 9381 §5.4.3): the first 16 bytes of SHA-512(suite || 0x02
    || the five points || 0x00), little-endian."""
    digest = hashlib.sha512(SUITE + b"\x02" + b"".join(points) + b"\x00").digest()
    return int.from_bytes(digest[:C_BYTES], "little")


# --- keys ---


def _as_bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, memoryview):
        return value.tobytes()
    raise VRFInputType(f"the VRF {what} must be bytes, not {type(value).__name__}")


class SecretKey:
    """An ECVRF secret key expanded per RFC 8032 §5.1.5: the scalar x (SHA-512 of the 32-byte
    secret, first half, clamped; kept reduced mod L), the nonce prefix (second half) and the
    public key x*B. The repr shows only the public key."""

    __slots__ = ("_prefix", "_x", "public_key")

    def __init__(self, secret: object) -> None:
        secret = _as_bytes(secret, "secret key")
        if len(secret) != SECRET_KEY_BYTES:
            raise VRFSecretKeyLength(f"a VRF secret key is {SECRET_KEY_BYTES} bytes, not {len(secret)}")
        h = hashlib.sha512(secret).digest()
        clamped = bytearray(h[:32])
        clamped[0] &= 248
        clamped[31] &= 127
        clamped[31] |= 64
        self._x: bytes = crypto_core_ed25519_scalar_reduce(bytes(clamped) + bytes(32))
        self._prefix: bytes = h[32:]
        self.public_key: bytes = crypto_scalarmult_ed25519_base_noclamp(self._x)

    def __repr__(self) -> str:
        return f"SecretKey(public_key={self.public_key.hex()})"


def keygen(secret: object) -> SecretKey:
    """The key of a 32-byte secret (which must come from a CSPRNG, e.g. os.urandom(32))."""
    return SecretKey(secret)


def public_key(secret: object) -> bytes:
    """The 32-byte public key of a 32-byte secret: the same as its Ed25519 public key."""
    return SecretKey(secret).public_key


# --- prove, proof_to_hash, verify (RFC 9381 §5.1-5.3) ---


def prove(key: object, alpha: object) -> bytes:
    """ECVRF_prove (RFC 9381 §5.1): the 80-byte proof of `alpha` under `key` (a SecretKey or its
    32-byte secret). Deterministic: the same key and alpha always give the same proof."""
    sk = key if isinstance(key, SecretKey) else SecretKey(key)
    alpha = _as_bytes(alpha, "alpha")
    h_string = encode_to_curve(sk.public_key, alpha)
    k = nonce(sk._prefix, h_string)  # pyright: ignore[reportPrivateUsage]
    k_bytes = _scalar_bytes(k)
    u = _smul_base(k)
    if h_string == _IDENTITY_BYTES:  # 8 * a point of small order: about 2^-250 per alpha
        gamma = _IDENTITY_BYTES
    else:
        gamma = crypto_scalarmult_ed25519_noclamp(sk._x, h_string)  # pyright: ignore[reportPrivateUsage]
    v = _h_times(k, h_string)  # k is 0 mod L with probability 2^-252
    c = challenge(sk.public_key, h_string, gamma, u, v)
    c_bytes = _scalar_bytes(c)
    s = crypto_core_ed25519_scalar_add(
        k_bytes,
        crypto_core_ed25519_scalar_mul(c_bytes, sk._x),  # pyright: ignore[reportPrivateUsage]
    )
    return gamma + c_bytes[:C_BYTES] + s


def _decode_proof(pi: object) -> tuple[bytes, int, int]:
    """ECVRF_decode_proof (RFC 9381 §5.4.4) after the length check: (Gamma's encoding, c, s).
    Whether Gamma is a point is checked next (`_gamma_multiples`), then s."""
    data = _as_bytes(pi, "proof")
    if len(data) != PROOF_BYTES:
        raise VRFProofLength(f"a VRF proof is {PROOF_BYTES} bytes, not {len(data)}")
    return data[:32], int.from_bytes(data[32:48], "little"), int.from_bytes(data[48:], "little")


def _check_s(s: int) -> None:
    if s >= L:
        raise VRFScalarNotReduced(f"the proof's s {_scalar_bytes(s).hex()} is not below the group order L")


def _gamma_multiples(gamma: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    multiples = _multiples(gamma)
    if multiples is None:
        raise VRFGammaNotPoint(f"the proof's Gamma {gamma.hex()} is not an edwards25519 point")
    return multiples


def _beta(gamma_times_cofactor: bytes) -> bytes:
    return hashlib.sha512(SUITE + b"\x03" + gamma_times_cofactor + b"\x00").digest()


def proof_to_hash(pi: object) -> bytes:
    """ECVRF_proof_to_hash (RFC 9381 §5.2): beta = SHA-512(suite || 0x03 || 8*Gamma || 0x00).

    It decodes the proof but does not verify it: use `verify` on a proof from anyone else."""
    gamma, _, s = _decode_proof(pi)
    gamma_multiples = _gamma_multiples(gamma)
    _check_s(s)
    return _beta(gamma_multiples[3])


def _check_public_key(pk: object) -> bytes:
    data = _as_bytes(pk, "public key")
    if len(data) != PUBLIC_KEY_BYTES:
        raise VRFPublicKeyLength(f"a VRF public key is {PUBLIC_KEY_BYTES} bytes, not {len(data)}")
    return data


def validate_key(pk: object) -> bytes:
    """ECVRF_validate_key (RFC 9381 §5.4.5): the key's 32 bytes if they decode as a point not of
    small order (order 1, 2, 4 or 8), else a VRFError. `verify` makes the same checks."""
    data = _check_public_key(pk)
    _key_times(1, data)
    return data


def _key_times(k: int, y: bytes) -> bytes:
    """k * Y, refusing a key that is not a point or is of small order (8 * Y the identity).
    libsodium accepting Y already shows it is a point of the prime-order subgroup, not the
    identity; only a key it refuses (or k = 0) is looked at more closely."""
    try:
        return crypto_scalarmult_ed25519_noclamp(_scalar_bytes(k), y)
    except SodiumError:
        pass
    multiples = _multiples(y)
    if multiples is None:
        raise VRFPublicKeyNotPoint(f"the VRF public key {y.hex()} is not an edwards25519 point")
    if multiples[3] == _IDENTITY_BYTES:
        raise VRFPublicKeySmallOrder(f"the VRF public key {y.hex()} is of small order")
    return _times(k, multiples)


def verify(pk: object, alpha: object, pi: object) -> bytes:
    """ECVRF_verify (RFC 9381 §5.3, with key validation): beta if `pi` proves `alpha` under `pk`,
    else a VRFError naming what is wrong. Reads exactly 32 + 80 bytes of key and proof.

    Refusals, in order: VRFInputType, VRFPublicKeyLength, VRFProofLength, VRFPublicKeyNotPoint,
    VRFPublicKeySmallOrder, VRFGammaNotPoint, VRFScalarNotReduced, VRFProofInvalid."""
    pk, alpha, pi = _as_bytes(pk, "public key"), _as_bytes(alpha, "alpha"), _as_bytes(pi, "proof")
    y = _check_public_key(pk)
    gamma, c, s = _decode_proof(pi)
    c_y = _key_times(c, y)
    gamma_multiples = _gamma_multiples(gamma)
    _check_s(s)
    try:
        c_gamma = crypto_scalarmult_ed25519_noclamp(_scalar_bytes(c), gamma)
    except SodiumError:  # Gamma outside the prime-order subgroup, or c = 0
        c_gamma = _times(c, gamma_multiples)
    h_string = encode_to_curve(y, alpha)
    u = _sub(_smul_base(s), c_y)
    v = _sub(_h_times(s, h_string), c_gamma)
    if challenge(y, h_string, gamma, u, v) != c:
        raise VRFProofInvalid("the VRF proof does not verify under this public key for this alpha")
    return _beta(gamma_multiples[3])
