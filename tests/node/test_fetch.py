"""Opening downloads over real HTTP: size caps, retries with backoff, resume by Range, bad URIs."""

from __future__ import annotations

import http.server
import threading

import pytest

from node.egress import EgressPolicy
from node.fetch import FetchError, FetchPolicy, fetch_bytes, fetch_to_file, resolve_uri

# The test servers listen on loopback, which the egress policy refuses unless it is named.
LOOPBACK = EgressPolicy.from_allow(["127.0.0.1"])
FAST = FetchPolicy(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=10, attempts=4, backoff_base_s=0.01,
                   backoff_max_s=0.05, egress=LOOPBACK)
BODY = bytes(range(256)) * 1000  # 256 000 bytes


class Server:
    """A file server that can fail its first N requests or cut its first answer short."""

    def __init__(self) -> None:
        self.fail_first = 0
        self.cut_first_at: int | None = None
        self.requests: list[dict] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests.append({"path": self.path, "range": self.headers.get("Range")})
                if self.path == "/missing":
                    self.send_error(404)
                    return
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_error(503)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(BODY) - start))
                self.end_headers()
                data = BODY[start:]
                if outer.cut_first_at is not None:
                    data = data[:outer.cut_first_at]
                    outer.cut_first_at = None
                    self.wfile.write(data)
                    self.wfile.flush()
                    self.connection.shutdown(2)  # drop the connection mid-body
                    return
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()  # the listening socket, which shutdown() leaves open


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def test_streams_to_disk_atomically(server, tmp_path):
    dest = tmp_path / "o" / "x.opening"
    assert fetch_to_file(server.url + "/f", dest, max_bytes=10**6, policy=FAST) == len(BODY)
    assert dest.read_bytes() == BODY
    assert not (tmp_path / "o" / "x.opening.part").exists()


def test_size_cap_refuses_without_retrying(server, tmp_path):
    with pytest.raises(FetchError) as exc:
        fetch_to_file(server.url + "/f", tmp_path / "x", max_bytes=1000, policy=FAST)
    assert exc.value.kind == "too_large" and "cap is 1000" in exc.value.reason
    assert len(server.requests) == 1
    assert not (tmp_path / "x").exists()


def test_transient_errors_are_retried(server, tmp_path):
    server.fail_first = 2
    assert fetch_to_file(server.url + "/f", tmp_path / "x", max_bytes=10**6, policy=FAST) == len(BODY)
    assert len(server.requests) == 3


def test_gives_up_after_the_last_attempt(server, tmp_path):
    server.fail_first = 10
    with pytest.raises(FetchError) as exc:
        fetch_to_file(server.url + "/f", tmp_path / "x", max_bytes=10**6, policy=FAST)
    assert exc.value.kind == "http_status" and "503" in exc.value.reason
    assert len(server.requests) == FAST.attempts


def test_404_is_not_retried(server, tmp_path):
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch_to_file(server.url + "/missing", tmp_path / "x", max_bytes=10**6, policy=FAST)
    assert len(server.requests) == 1


def test_cut_download_resumes_with_range(server, tmp_path):
    server.cut_first_at = 100_000
    assert fetch_to_file(server.url + "/f", tmp_path / "x", max_bytes=10**6, policy=FAST) == len(BODY)
    assert (tmp_path / "x").read_bytes() == BODY
    assert server.requests[0]["range"] is None
    assert server.requests[1]["range"] is not None and server.requests[1]["range"].startswith("bytes=")


def test_unreachable_host(tmp_path):
    with pytest.raises(FetchError) as exc:
        fetch_to_file("http://127.0.0.1:9/x", tmp_path / "x", max_bytes=10, policy=FAST)
    assert exc.value.kind == "unreachable"


def test_fetch_bytes_cap(server):
    assert fetch_bytes(server.url + "/f", max_bytes=10**6, policy=FAST) == BODY
    with pytest.raises(FetchError, match="cap"):
        fetch_bytes(server.url + "/f", max_bytes=10, policy=FAST)


@pytest.mark.parametrize("uri, endpoint, want", [
    ("http://h:1/openings/ab", "", "http://h:1/openings/ab"),
    ("openings/ab", "http://h:1", "http://h:1/openings/ab"),
    ("/openings/ab", "http://h:1/prover", "http://h:1/prover/openings/ab"),
])
def test_resolve_uri(uri, endpoint, want):
    assert resolve_uri(uri, endpoint) == want


@pytest.mark.parametrize("uri", ["file:///etc/passwd", "ftp://h/x", "openings/ab"])
def test_resolve_uri_refuses_other_schemes(uri):
    with pytest.raises(FetchError) as exc:
        resolve_uri(uri, "")
    assert exc.value.kind == "bad_uri"


def test_stop_leaves_the_partial_file_for_a_resume(server, tmp_path):
    from node.fetch import FetchStopped

    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2  # let the first attempt start, then stop mid-body

    with pytest.raises(FetchStopped):
        fetch_to_file(server.url + "/f", tmp_path / "x", max_bytes=10**6, policy=FAST, stop=stop)
    assert not (tmp_path / "x").exists()
    assert fetch_to_file(server.url + "/f", tmp_path / "x", max_bytes=10**6, policy=FAST) == len(BODY)
    assert (tmp_path / "x").read_bytes() == BODY


# --- the fetch stage: the opening's URI, then its mirrors ---------------------------------------


def _stage(uri: str, tmp_path, mirrors=()):
    from node.pipeline import stage_fetch

    return stage_fetch(uri=uri, endpoint="", run_id=b"\0" * 32, dest=tmp_path / "o.opening", leaves_dest=None,
                       max_opening_bytes=10**6, max_leaves_bytes=0, policy=FAST, mirrors=tuple(mirrors))


def test_the_fetch_stage_falls_back_to_a_mirror_and_names_the_address_that_served(server, tmp_path):
    mirror = Server()
    try:
        out = _stage(server.url + "/missing", tmp_path, [mirror.url + "/f"])
    finally:
        mirror.close()
    assert out.ok and out.data["url"] == mirror.url + "/f" and out.data["bytes"] == len(BODY)
    assert (tmp_path / "o.opening").read_bytes() == BODY
    [failed] = out.data["tried"]
    assert failed.startswith(server.url + "/missing") and "HTTP 404" in failed
    # Each address had the whole policy: the primary's 404 once, the mirror's answer once.
    assert [r["path"] for r in server.requests] == ["/missing"] and len(mirror.requests) == 1


def test_the_fetch_stage_gives_each_address_its_own_retries(server, tmp_path):
    server.fail_first = 1  # the primary answers on its second attempt: no mirror is asked
    unused = Server()
    try:
        out = _stage(server.url + "/f", tmp_path, [unused.url + "/f"])
    finally:
        unused.close()
    assert out.ok and out.data["url"] == server.url + "/f" and "tried" not in out.data
    assert len(server.requests) == 2 and unused.requests == []


def test_the_fetch_stage_refuses_unavailable_when_no_address_serves(server, tmp_path):
    out = _stage("ftp://127.0.0.1/x", tmp_path, [server.url + "/missing", "http://127.0.0.1:9/x"])
    assert not out.ok and out.refusal_class == "unavailable"
    assert len(out.data["tried"]) == 3 and "bad_uri" in out.data["tried"][0] and "HTTP 404" in out.reason
    assert not (tmp_path / "o.opening").exists() and not (tmp_path / "o.opening.part").exists()
