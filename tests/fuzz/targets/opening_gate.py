"""challenges.opening.OpeningGate, what node.fetch asks after the first bytes of a download: the
bytes are an opening's prefix; the answer is "read more", the size the whole file must have, or
OpeningRefused. The digest on chain is the one of the manifest in the bytes (computed from them),
so that mutations get past it to the spec and size checks; the spec digest is the honest run's."""

from __future__ import annotations

import struct

from challenges.opening import MAGIC, OPENING_VERSION, OpeningGate, OpeningRefused, load_opening
from commitments import cbor
from commitments.hashing import h
from commitments.spec import Spec
from tests.fuzz.targets import _opening

_SPEC_DIGEST = Spec.from_cbor(load_opening(_opening.base()[0]).spec_bytes).digest()
_HEADER = len(MAGIC) + 4


def TestOneInput(data: bytes) -> None:
    mlen = struct.unpack(">I", data[len(MAGIC):_HEADER])[0] if len(data) >= _HEADER else 0
    # manifest_digest(manifest) for a canonical manifest, from its bytes (nothing decoded).
    claimed = h(b"\x82" + cbor.encode(OPENING_VERSION) + data[_HEADER:_HEADER + mlen])
    gate = OpeningGate(expected_digest=claimed, spec_digest=_SPEC_DIGEST)
    try:
        done, size = gate(data)
    except OpeningRefused as exc:
        if not exc.reason:
            raise AssertionError("a refusal must say why") from exc
        return
    if not isinstance(size, int) or size < (len(data) if not done else _HEADER):
        raise AssertionError(f"the gate asked for {size!r} bytes after {len(data)}")


def seeds() -> dict[str, bytes]:
    data = _opening.base()[0]
    op = load_opening(data)
    return {"honest-prefix": data[:_HEADER + len(op.manifest_bytes)], "header": data[:_HEADER]}
