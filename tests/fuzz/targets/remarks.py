"""chain.calls.decode_call on arbitrary remark bytes: a call that encodes back to the same bytes,
or CallDecodeError with a stable reason code. decode_call turns an unexpected exception into the
reason "decoder_fault" so that a node reads on; here that is a crash, re-raised from inside."""

from __future__ import annotations

from chain.calls import IGNORE_REASONS, CallDecodeError, _decode_call, decode_call, encode_call


def TestOneInput(data: bytes) -> None:
    try:
        call = decode_call(data)
    except CallDecodeError as exc:
        if exc.reason == "decoder_fault":
            _decode_call(data)  # the exception the containment caught, with its traceback
        if exc.reason not in IGNORE_REASONS:
            raise AssertionError(f"refusal reason {exc.reason!r} is not a code of IGNORE_REASONS") from exc
        return
    if encode_call(call) != data:
        raise AssertionError("a decoded call does not encode back to its bytes")


def sample_calls() -> list:
    """One call of each kind (the opening twice: without and with mirrors), in a fixed order the
    substrate_block seeds index into."""
    import dataclasses

    from chain.calls import (
        BondVerifier,
        CommitWitness,
        DeclareWitnessNormBucket,
        RevealWitnessValue,
        UnbondVerifier,
    )
    from tests.chain.runs import SyntheticRun

    run = SyntheticRun(steps=4)
    cid = bytes(range(32))
    opening = run.opening(cid, 2)
    return [run.register(), run.submit_full_root(), opening, CommitWitness(cid, b"\2" * 32),
            RevealWitnessValue(cid, b"\3" * 32, b"\5" * 32, 5, b"\4" * 16), DeclareWitnessNormBucket(cid, -3),
            BondVerifier(100), UnbondVerifier(40),
            dataclasses.replace(opening, mirrors=("http://mirror.test/o", "http://mirror2.test/o"))]


def seeds() -> dict[str, bytes]:
    out = {}
    for c in sample_calls():
        name = type(c).__name__ + ("-mirrors" if getattr(c, "mirrors", ()) else "")
        out[name] = encode_call(c)
    return out
