"""The prover's Range handling under hostile headers: strict parsing with a length cap, 206 with the
exact slice or 416 with the size, never a server error (whatever the digits, signs or bytes)."""

from __future__ import annotations

import os

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miner.prover import RANGE_MAX_CHARS, create_app, parse_range

SIZE = 4096
DIGEST = "ab" * 32


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run = tmp_path_factory.mktemp("prover-range")
    (run / "openings").mkdir()
    data = os.urandom(SIZE)
    (run / "openings" / f"{DIGEST}.opening").write_bytes(data)
    with TestClient(create_app(run)) as c:
        yield c, data


def test_a_range_of_5000_digits_is_a_416_not_a_500(served):
    c, _ = served
    for header in ("bytes=" + "9" * 5000 + "-", "bytes=0-" + "9" * 5000, "bytes=-" + "9" * 5000,
                   "bytes=" + "1" * 5000 + "-" + "2" * 5000):
        r = c.get(f"/openings/{DIGEST}", headers={"Range": header})
        assert r.status_code == 416, (header[:20], r.status_code, r.text[:200])
        assert r.headers["content-range"] == f"bytes */{SIZE}"


def test_long_positions_under_the_cap_mean_past_the_end(served):
    c, data = served
    big = "9" * 40  # more digits than any file size, within the header cap
    r = c.get(f"/openings/{DIGEST}", headers={"Range": f"bytes=100-{big}"})
    assert r.status_code == 206 and r.content == data[100:]
    assert r.headers["content-range"] == f"bytes 100-{SIZE - 1}/{SIZE}"
    assert c.get(f"/openings/{DIGEST}", headers={"Range": f"bytes=-{big}"}).content == data
    assert c.get(f"/openings/{DIGEST}", headers={"Range": f"bytes={big}-"}).status_code == 416
    assert c.get(f"/openings/{DIGEST}", headers={"Range": "bytes=" + "0" * 30 + "7-9"}).content == data[7:10]


@pytest.mark.parametrize("header", ["bytes=\u0661-\u0662", "bytes=+1-2", "bytes=1-2,4-5", "bytes= 1-2",
                                    "items=1-2", "bytes=-", "bytes=5-1", "bytes=-0", "bytes=1_0-20"])
def test_strict_syntax(header):
    assert parse_range(header, SIZE) is None


def test_the_cap_counts_the_whole_header():
    assert parse_range("bytes=0-" + "0" * (RANGE_MAX_CHARS - 8), SIZE) == (0, 0)
    assert parse_range("bytes=0-" + "0" * (RANGE_MAX_CHARS - 7), SIZE) is None


_positions = st.one_of(st.just(""), st.integers(0, 2 * SIZE).map(str), st.text("0123456789", max_size=6000),
                       st.integers(0, 10**30).map(str), st.integers(4000, 6000).map(lambda n: "9" * n))
_headers = st.one_of(
    st.builds(lambda a, b: f"bytes={a}-{b}", _positions, _positions),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300),
    st.builds(lambda a, b, junk: f"bytes={a}-{b}{junk}", _positions, _positions,
              st.sampled_from([",0-1", " ", "-", "x", ", 5-", "\t"])),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_headers)
def test_random_range_headers_never_get_a_5xx(served, header):
    c, data = served
    r = c.get(f"/openings/{DIGEST}", headers={"Range": header})
    assert r.status_code in (206, 416), (header[:80], r.status_code, r.text[:200])
    span = parse_range(header, SIZE)
    if r.status_code == 206:
        first, last = span
        assert r.content == data[first:last + 1]
        assert r.headers["content-range"] == f"bytes {first}-{last}/{SIZE}"
    else:
        assert span is None and r.headers["content-range"] == f"bytes */{SIZE}"
