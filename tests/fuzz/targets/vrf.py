"""commitments.vrf.verify's decoding of a key and a proof: the first 32 bytes are the public key,
the rest the proof, alpha is fixed. verify either returns a 64-byte beta (then proof_to_hash of the
proof gives the same, and the proof does not verify for another alpha) or refuses with a VRFError
that carries its code; nothing else escapes, and every input takes a bounded time (the key and
proof are fixed-size; a proof outside libsodium's subgroup costs a few Python multiplications)."""

from __future__ import annotations

from commitments import vrf

ALPHA = b"fuzz"
CODES = {
    cls.code
    for cls in (vrf.VRFPublicKeyLength, vrf.VRFProofLength, vrf.VRFPublicKeyNotPoint,
                vrf.VRFPublicKeySmallOrder, vrf.VRFGammaNotPoint, vrf.VRFScalarNotReduced,
                vrf.VRFProofInvalid)
}


def TestOneInput(data: bytes) -> None:
    pk, pi = data[:32], data[32:]
    try:
        beta = vrf.verify(pk, ALPHA, pi)
    except vrf.VRFError as exc:
        if exc.code not in CODES:
            raise AssertionError(f"verify refused bytes with an unexpected code {exc.code}: {exc}") from exc
        return
    if len(beta) != vrf.BETA_BYTES or vrf.proof_to_hash(pi) != beta:
        raise AssertionError("verify accepted a proof whose beta is not proof_to_hash's")
    try:
        vrf.verify(pk, ALPHA + b"!", pi)
    except vrf.VRFProofInvalid:
        return
    raise AssertionError("one proof verified for two alphas")


def seeds() -> dict[str, bytes]:
    key = vrf.keygen(b"\x11" * 32)
    other = vrf.keygen(b"\x22" * 32)
    pi = vrf.prove(key, ALPHA)
    order_2 = (vrf.P - 1).to_bytes(32, "little")
    return {
        "valid": key.public_key + pi,
        "valid-other": other.public_key + vrf.prove(other, ALPHA),
        "wrong-key": other.public_key + pi,
        "small-order-key": order_2 + pi,
        "identity-gamma": key.public_key + (1).to_bytes(32, "little") + pi[32:],
        "s-is-L": key.public_key + pi[:48] + vrf.L.to_bytes(32, "little"),
        "short": key.public_key + pi[:40],
    }
