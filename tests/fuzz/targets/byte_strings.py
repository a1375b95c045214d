"""commitments.cbor.decode_byte_strings, the compact parser leaf lists are read with, against
cbor.decode on the same bytes: both accept exactly the canonical arrays of byte strings, with the
same items (read by iteration, by index and through a slice); the parser refuses everything else
with a CommitmentError."""

from __future__ import annotations

from commitments import cbor
from commitments.errors import CommitmentError


def TestOneInput(data: bytes) -> None:
    try:
        want = cbor.decode(data)
    except CommitmentError:
        want = None
    ok = isinstance(want, list) and all(isinstance(x, bytes) for x in want)
    try:
        got = cbor.decode_byte_strings(data)
    except CommitmentError as exc:
        if ok:
            raise AssertionError(f"a list of byte strings that cbor.decode reads was refused: {exc}") from exc
        return
    if not ok:
        raise AssertionError(
            "decode_byte_strings accepted what cbor.decode does not read as a list of byte strings"
        )
    if list(got) != want or [got[i] for i in range(len(got))] != want or list(got[1:-1]) != want[1:-1]:
        raise AssertionError("decode_byte_strings gave other items than cbor.decode")


def seeds() -> dict[str, bytes]:
    from commitments.leaves import step_leaf

    return {
        "empty": cbor.encode([]),
        "leaves": cbor.encode(
            [step_leaf(t, bytes([t]) * 32, 0 if t == 0 else 0x3F800000 - t) for t in range(20)]
        ),
        "lengths": cbor.encode([b"", b"a", b"x" * 23, b"y" * 24, b"z" * 255, b"w" * 256]),
        "not-bytes": cbor.encode([b"a", [], {}, 1, "t"]),
    }
