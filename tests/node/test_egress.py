"""The fetch as an attacker would use it: addresses inside the verifier's network, redirects,
proxies from the environment, compression bombs, openings larger than their spec, a full disk."""

from __future__ import annotations

import http.server
import ipaddress
import socket
import struct
import threading
import zlib

import pytest

from challenges.opening import OpeningGate, build_opening, load_opening, manifest_digest, state_size_bound
from challenges.refused import fetch_refusal_class
from commitments import cbor, merkle
from node.egress import EgressPolicy, EgressRefused, forbidden, parse_allow
from node.fetch import FetchError, FetchPolicy, OpeningsFull, OpeningsStore, fetch_bytes, fetch_to_file
from node.pipeline import ChainFacts, stage_fetch
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk

LOOPBACK = EgressPolicy.from_allow(["127.0.0.1"])
FAST = dict(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=10, attempts=2, backoff_base_s=0.01,
            backoff_max_s=0.02)
OPEN = FetchPolicy(**FAST, egress=LOOPBACK)
DEFAULT = FetchPolicy(**FAST)  # the default egress policy: nothing but global addresses


class Server:
    """Serves `routes` (path -> (status, headers, body chunks)); counts requests and bytes sent."""

    def __init__(self, routes: dict) -> None:
        self.routes = routes
        self.requests: list[dict] = []
        self.sent = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests.append({"path": self.path, "headers": dict(self.headers)})
                status, headers, body = outer.routes.get(self.path, (404, {}, [b""]))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    for chunk in body() if callable(body) else body:
                        self.wfile.write(chunk)
                        outer.sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def make(routes):
        servers.append(Server(routes))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def no_connections(monkeypatch):
    """Records every TCP connection attempt (the refusals below must happen before any)."""
    attempts: list = []
    real = socket.create_connection

    def spy(address, *a, **kw):
        attempts.append(address)
        return real(address, *a, **kw)

    monkeypatch.setattr(socket, "create_connection", spy)
    return attempts


# --- the address rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addr",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "100.127.255.254",
        "169.254.169.254",
        "169.254.0.1",
        "224.0.0.1",
        "239.255.255.250",
        "0.0.0.0",
        "240.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "198.18.0.1",
        "::1",
        "::",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::a00:1",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "2002:a00:1::1",
        "2002:7f00:1::",
        "::127.0.0.1",
        "2001:db8::1",
        "fec0::1",
        "2001::1",
    ],
)
def test_addresses_inside_networks_are_refused_by_default(addr):
    assert forbidden(ipaddress.ip_address(addr)) is not None, addr


@pytest.mark.parametrize("addr", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111",
                                  "64:ff9b::808:808", "::ffff:8.8.8.8", "2002:808:808::1"])
def test_global_addresses_pass(addr):
    assert forbidden(ipaddress.ip_address(addr)) is None, addr


def test_allow_list_names_addresses_networks_and_hosts():
    nets, names = parse_allow(["127.0.0.1", "10.1.0.0/16", "[::1]", "Prover.LAN.", " "])
    assert [str(n) for n in nets] == ["127.0.0.1/32", "10.1.0.0/16", "::1/128"] and names == {"prover.lan"}
    with pytest.raises(ValueError, match="neither an address"):
        parse_allow(["http://x/"])
    policy = EgressPolicy.from_allow(["10.1.0.0/16"])
    assert policy.resolve("10.1.2.3", 80) == [ipaddress.ip_address("10.1.2.3")]
    with pytest.raises(EgressRefused, match="private"):
        policy.resolve("10.2.0.1", 80)
    # A name resolving to a mix of public and private addresses (a rebinding host) is refused whole.
    mixed = EgressPolicy(resolver=lambda host, port: ["8.8.8.8", "10.0.0.5"])
    with pytest.raises(EgressRefused, match="10.0.0.5"):
        mixed.resolve("rebind.example", 80)
    trusted = EgressPolicy.from_allow(["prover.lan"], resolver=lambda host, port: ["10.9.9.9"])
    assert trusted.resolve("PROVER.lan.", 80) == [ipaddress.ip_address("10.9.9.9")]


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://[::1]:8700/api/v1/status",
                                 "http://10.0.0.7:5432/", "http://[::ffff:127.0.0.1]:22/", "https://100.100.1.1/",
                                 "http://0.0.0.0:8700/", "http://[fe80::1]/", "http://[64:ff9b::a00:7]/"])
def test_direct_urls_into_the_network_are_refused_without_a_connection(url, tmp_path, no_connections):
    with pytest.raises(FetchError) as exc:
        fetch_to_file(url, tmp_path / "x", max_bytes=10**6, policy=DEFAULT)
    assert exc.value.kind == "refused_address" and not exc.value.retryable
    with pytest.raises(FetchError):
        fetch_bytes(url, max_bytes=10**6, policy=DEFAULT)
    assert no_connections == []
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.part").exists()


@pytest.mark.parametrize("host", ["localhost", "2130706433", "0x7f000001", "127.1", "0177.0.0.1"])
def test_other_spellings_of_loopback_are_refused_by_what_they_resolve_to(host, tmp_path, no_connections):
    # The resolver turns these into 127.0.0.1 (or ::1); that answer is what the policy judges.
    with pytest.raises(FetchError) as exc:
        fetch_to_file(f"http://{host}:8700/o", tmp_path / "x", max_bytes=100, policy=DEFAULT)
    assert exc.value.kind in ("refused_address", "bad_uri") and no_connections == []


def test_loopback_is_refused_unless_named(serve, tmp_path, no_connections):
    s = serve({"/f": (200, {"Content-Length": "3"}, [b"abc"])})
    with pytest.raises(FetchError) as exc:
        fetch_to_file(s.url + "/f", tmp_path / "x", max_bytes=100, policy=DEFAULT)
    assert exc.value.kind == "refused_address" and "loopback" in exc.value.reason
    assert no_connections == [] and s.requests == []
    assert fetch_to_file(s.url + "/f", tmp_path / "x", max_bytes=100, policy=OPEN) == 3


def test_the_name_stays_in_the_host_header(serve, tmp_path):
    s = serve({"/f": (200, {"Content-Length": "3"}, [b"abc"])})
    named = FetchPolicy(**FAST, egress=EgressPolicy.from_allow(["prover.test"],
                                                              resolver=lambda host, port: ["127.0.0.1"]))
    assert fetch_to_file(f"http://prover.test:{s.port}/f", tmp_path / "x", max_bytes=100, policy=named) == 3
    assert s.requests[0]["headers"]["Host"] == f"prover.test:{s.port}"
    assert s.requests[0]["headers"]["Accept-Encoding"] == "identity"


def test_a_name_is_resolved_once_and_that_address_is_used(serve, tmp_path):
    # A rebinding resolver would answer differently the second time; the node asks once per attempt.
    s = serve({"/f": (200, {"Content-Length": "3"}, [b"abc"])})
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])
    pinned = FetchPolicy(**FAST, egress=EgressPolicy.from_allow(["127.0.0.1"],
                                                               resolver=lambda host, port: next(answers)))
    assert fetch_to_file(f"http://rebind.test:{s.port}/f", tmp_path / "x", max_bytes=100, policy=pinned) == 3


# --- redirects -------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["http://127.0.0.1:{port}/secret", "http://10.0.0.1/secret",
                                   "http://169.254.169.254/latest/meta-data/"])
def test_redirects_are_not_followed(where, serve, tmp_path):
    inside = serve({"/secret": (200, {"Content-Length": "6"}, [b"secret"])})
    # The miner's prover is reachable by its allowed name; the redirect points elsewhere.
    origin = serve({"/o": (302, {"Location": where.format(port=inside.port), "Content-Length": "0"}, [b""])})
    policy = FetchPolicy(**FAST, egress=EgressPolicy.from_allow(["prover.test"],
                                                               resolver=lambda host, port: ["127.0.0.1"]))
    url = f"http://prover.test:{origin.port}/o"
    with pytest.raises(FetchError) as exc:
        fetch_to_file(url, tmp_path / "x", max_bytes=100, policy=policy)
    assert exc.value.kind == "redirect" and not exc.value.retryable
    with pytest.raises(FetchError, match="redirects are not followed"):
        fetch_bytes(url, max_bytes=100, policy=policy)
    assert inside.requests == [] and len(origin.requests) == 2
    assert not (tmp_path / "x").exists()


# --- proxies -------------------------------------------------------------------------------------


def test_proxy_variables_of_the_environment_are_ignored(serve, tmp_path, monkeypatch):
    proxy = serve({})
    s = serve({"/f": (200, {"Content-Length": "3"}, [b"abc"])})
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(var, proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert fetch_to_file(s.url + "/f", tmp_path / "x", max_bytes=100, policy=OPEN) == 3
    assert fetch_bytes(s.url + "/f", max_bytes=100, policy=OPEN) == b"abc"
    assert proxy.requests == [] and len(s.requests) == 2


# --- sizes ----------------------------------------------------------------------------------------


def _zeros_gzip(total: int) -> list[bytes]:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    block = bytes(1 << 20)
    out = [comp.compress(block) for _ in range(total // len(block))]
    out.append(comp.flush())
    return [c for c in out if c]


def test_a_gzip_bomb_is_refused_before_a_byte_is_written(serve, tmp_path):
    bomb = _zeros_gzip(512 * 1024**2)
    wire = sum(map(len, bomb))
    assert wire < 1024**2  # half a megabyte on the wire that would inflate to 512 MiB
    s = serve({"/bomb": (200, {"Content-Encoding": "gzip", "Content-Length": str(wire)}, bomb)})
    dest = tmp_path / "o" / "x.opening"
    with pytest.raises(FetchError) as exc:
        fetch_to_file(s.url + "/bomb", dest, max_bytes=64 * 1024**2, policy=OPEN)
    assert exc.value.kind == "content_encoding" and not exc.value.retryable
    assert not dest.exists() and not dest.with_name(dest.name + ".part").exists()
    with pytest.raises(FetchError, match="Content-Encoding"):
        fetch_bytes(s.url + "/bomb", max_bytes=64 * 1024**2, policy=OPEN)
    # The same bytes without the header are only what they are on the wire: never decoded.
    s.routes["/plain"] = (200, {"Content-Length": str(wire)}, bomb)
    assert fetch_to_file(s.url + "/plain", dest, max_bytes=2 * 1024**2, policy=OPEN) == wire
    assert dest.stat().st_size == wire


def test_an_endless_body_stops_at_the_cap(serve, tmp_path):
    def endless():
        while True:
            yield bytes(64 * 1024)

    s = serve({"/e": (200, {}, endless)})
    part = tmp_path / "x.part"
    with pytest.raises(FetchError) as exc:
        fetch_to_file(s.url + "/e", tmp_path / "x", max_bytes=300_000, policy=OPEN)
    assert exc.value.kind == "too_large" and "300000" in exc.value.reason
    assert not part.exists() and not (tmp_path / "x").exists()


# --- openings sized by their spec -----------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return walk(tiny_spec(3), corpus(tmp_path_factory.mktemp("data")))


def _opening(run, t=2) -> bytes:
    return build_opening(
        spec=run.spec,
        run_id=RUN_ID,
        step=t,
        pre_state=run.states[t - 1],
        dataset=run.dataset,
        schedule=run.schedule,
        leaves=run.leaves,
    )


def _facts(run, data: bytes, t=2) -> ChainFacts:
    op = load_opening(data)
    return ChainFacts(expected_digest=op.digest, run_id=RUN_ID, step=t, spec_digest=run.spec.digest(),
                      dataset_hash=run.dataset.dataset_hash, schedule_commitment=run.schedule.commitment,
                      initial_hash=run.states[0].digest(), root=merkle.root(run.leaves), size=len(run.leaves))


def _fetch(s, path, tmp_path, facts, *, store=None, cap=64 * 1024**2):
    return stage_fetch(uri=s.url + path, endpoint=s.url, run_id=RUN_ID, dest=tmp_path / "o" / "c.opening",
                       leaves_dest=tmp_path / "o" / "leaves" / "c.cbor", max_opening_bytes=cap,
                       max_leaves_bytes=1 << 20, policy=OPEN, facts=facts, store=store)


def test_an_honest_opening_passes_its_gate(run, serve, tmp_path):
    data = _opening(run)
    s = serve({"/o": (200, {"Content-Length": str(len(data))}, [data])})
    out = _fetch(s, "/o", tmp_path, _facts(run, data))
    assert out.ok, out.reason
    assert (tmp_path / "o" / "c.opening").read_bytes() == data
    assert len(data) <= 10 + len(load_opening(data).manifest_bytes) + state_size_bound(run.spec)


def test_an_opening_larger_than_its_spec_is_cut_at_its_size(run, serve, tmp_path):
    data = _opening(run)

    def padded():
        yield data
        while True:
            yield bytes(64 * 1024)

    s = serve(
        {"/o": (200, {}, padded), "/announced": (200, {"Content-Length": str(len(data) + 1)}, [data + b"\0"])}
    )
    out = _fetch(s, "/o", tmp_path, _facts(run, data))
    assert not out.ok and out.refusal_class == "unavailable"
    assert out.reason.startswith("too_large") and f"cap of {len(data)} bytes" in out.reason
    assert not (tmp_path / "o" / "c.opening").exists() and not (tmp_path / "o" / "c.opening.part").exists()
    announced = _fetch(s, "/announced", tmp_path, _facts(run, data))
    assert not announced.ok and f"{len(data) + 1} bytes announced" in announced.reason


def test_a_manifest_declaring_a_huge_state_is_refused_before_the_payload(run, serve, tmp_path):
    op = load_opening(_opening(run))
    m = dict(op.manifest)
    m["pre_state_len"] = state_size_bound(run.spec) + 1
    mb = cbor.encode(m)
    head = b"POTO1\n" + struct.pack(">I", len(mb)) + mb
    facts = ChainFacts(**{**_facts(run, _opening(run)).kwargs(), "expected_digest": manifest_digest(m)})

    def body():
        yield head
        while True:
            yield bytes(64 * 1024)

    s = serve({"/o": (200, {}, body)})
    out = _fetch(s, "/o", tmp_path, facts)
    assert not out.ok and out.refusal_class == "unavailable" and "its spec allows at most" in out.reason


def test_a_manifest_not_on_chain_is_refused_before_the_payload(run, serve, tmp_path):
    data = _opening(run)
    facts = ChainFacts(**{**_facts(run, data).kwargs(), "expected_digest": b"\x07" * 32})
    gate = OpeningGate(expected_digest=facts.expected_digest, spec_digest=facts.spec_digest)
    assert gate(data[:4]) == (False, 10)
    s = serve({"/o": (200, {"Content-Length": str(len(data))}, [data])})
    out = _fetch(s, "/o", tmp_path, facts)
    assert not out.ok and out.refusal_class == "invalid" and "digest on chain" in out.reason
    assert not (tmp_path / "o" / "c.opening").exists()


# --- one refusal class ----------------------------------------------------------------------------


def test_every_download_failure_reveals_the_same_class(run, serve, tmp_path):
    data = _opening(run)
    facts = _facts(run, data)
    s = serve(
        {
            "/gz": (200, {"Content-Encoding": "gzip"}, [b"x"]),
            "/302": (302, {"Location": "http://10.0.0.1/"}, [b""]),
            "/500": (500, {}, [b""]),
            "/404": (404, {}, [b""]),
        }
    )
    outs = {}
    for name, uri in {"address": "http://169.254.169.254/o", "dns": "http://no-such-host.invalid/o",
                      "closed": "http://127.0.0.1:9/o", "gzip": s.url + "/gz", "redirect": s.url + "/302",
                      "500": s.url + "/500", "404": s.url + "/404", "scheme": "file:///etc/passwd"}.items():
        out = stage_fetch(
            uri=uri,
            endpoint="",
            run_id=RUN_ID,
            dest=tmp_path / f"{name}.opening",
            leaves_dest=tmp_path / f"{name}.cbor",
            max_opening_bytes=1 << 20,
            max_leaves_bytes=1 << 20,
            policy=OPEN,
            facts=facts,
        )
        outs[name] = out
    assert {o.refusal_class for o in outs.values()} == {"unavailable"}
    # The detail stays with the node: its log and database say which failure it was.
    assert outs["address"].reason.startswith("refused_address") and outs["dns"].reason.startswith("dns")
    assert outs["gzip"].reason.startswith("content_encoding") and outs["redirect"].reason.startswith(
        "redirect"
    )
    assert fetch_refusal_class("too_large") == "unavailable"


# --- the openings folder --------------------------------------------------------------------------


def test_a_full_openings_folder_stops_new_fetches_only(run, serve, tmp_path):
    data = _opening(run)
    s = serve({"/o": (200, {"Content-Length": str(len(data))}, [data])})
    folder = tmp_path / "o"
    folder.mkdir()
    (folder / "old.opening").write_bytes(bytes(1000))
    # Under its quota, but this opening would pass it: the download stops, nothing is refused.
    with pytest.raises(OpeningsFull, match="quota"):
        _fetch(s, "/o", tmp_path, _facts(run, data), store=OpeningsStore(folder, quota_bytes=len(data)))
    assert not (folder / "c.opening").exists() and not (folder / "c.opening.part").exists()
    # Already at its quota: no connection at all.
    before = len(s.requests)
    with pytest.raises(OpeningsFull):
        _fetch(s, "/o", tmp_path, _facts(run, data), store=OpeningsStore(folder, quota_bytes=1000))
    assert len(s.requests) == before
    # A disk whose free space is at its reserve.
    with pytest.raises(OpeningsFull, match="reserve"):
        _fetch(s, "/o", tmp_path, _facts(run, data), store=OpeningsStore(folder, reserve_bytes=1 << 62))
    out = _fetch(
        s, "/o", tmp_path, _facts(run, data), store=OpeningsStore(folder, quota_bytes=10 * len(data))
    )
    assert out.ok and (folder / "c.opening").read_bytes() == data


def test_prune_removes_the_downloads_of_finished_challenges(tmp_path):
    store = OpeningsStore(tmp_path)
    (tmp_path / "leaves").mkdir()
    for name in (
        "aa.opening",
        "bb.opening",
        "bb.opening.part",
        "leaves/aa.cbor",
        "leaves/bb.cbor",
        "notes.txt",
    ):
        (tmp_path / name).write_bytes(b"x")
    assert store.prune({"aa"}) == 3
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "aa.opening", "leaves/aa.cbor", "notes.txt"]


# --- wall-clock budget ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_prover_is_cut_at_the_total_budget(where, tmp_path):
    import time as _time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    done = threading.Event()

    def trickle():
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            try:
                conn.recv(4096)
                if where == "body":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not done.is_set():  # one byte every 0.1 s: never a read timeout
                    conn.sendall(b"x" if where == "body" else b"X-Slow: 1\r\n")
                    _time.sleep(0.1)
            except OSError:
                pass
            finally:
                conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    policy = FetchPolicy(
        connect_timeout_s=2, read_timeout_s=5, total_timeout_s=1.0, attempts=1, egress=LOOPBACK
    )
    try:
        started = _time.monotonic()
        with pytest.raises(FetchError) as exc:
            fetch_to_file(f"http://127.0.0.1:{port}/o", tmp_path / "x", max_bytes=10**6, policy=policy)
        assert exc.value.kind == "unreachable" and "within 1 s" in exc.value.reason
        started_bytes = _time.monotonic()
        with pytest.raises(FetchError, match="within 1 s"):
            fetch_bytes(f"http://127.0.0.1:{port}/l", max_bytes=10**6, policy=policy)
        assert started_bytes - started < 2.5 and _time.monotonic() - started_bytes < 2.5
    finally:
        done.set()
        srv.close()


def test_stop_cuts_a_stalled_attempt(tmp_path):
    from node.fetch import FetchStopped

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    held = []
    threading.Thread(target=lambda: held.append(srv.accept()), daemon=True).start()  # accepts, never answers
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    policy = FetchPolicy(
        connect_timeout_s=2, read_timeout_s=30, total_timeout_s=60, attempts=1, egress=LOOPBACK
    )
    try:
        with pytest.raises(FetchStopped):
            fetch_to_file(f"http://127.0.0.1:{port}/o", tmp_path / "x", max_bytes=10**6, policy=policy,
                          stop=flag.is_set)
    finally:
        for conn, _ in held:  # the accepted connection, which the stopped fetch left
            conn.close()
        srv.close()


def test_a_configured_proxy_gets_the_checked_address(serve, tmp_path):
    proxy = serve({})
    port = 47  # never connected: the proxy answers for it
    proxy.routes[f"http://127.0.0.1:{port}/f"] = (200, {"Content-Length": "9"}, [b"via-proxy"])
    policy = FetchPolicy(
        **FAST,
        proxy=proxy.url,
        egress=EgressPolicy.from_allow(["prover.test"], resolver=lambda host, p: ["127.0.0.1"]),
    )
    assert fetch_bytes(f"http://prover.test:{port}/f", max_bytes=100, policy=policy) == b"via-proxy"
    assert proxy.requests[0]["path"] == f"http://127.0.0.1:{port}/f"
    assert proxy.requests[0]["headers"]["Host"] == f"prover.test:{port}"
    # The target is still judged by the node: a forbidden one never reaches the proxy.
    with pytest.raises(FetchError) as exc:
        fetch_bytes("http://169.254.169.254/latest/meta-data/", max_bytes=100, policy=policy)
    assert exc.value.kind == "refused_address" and len(proxy.requests) == 1


def test_config_gives_the_allow_list_proxy_and_openings_folder(tmp_path):
    from node.config import ConfigError, load_config

    p = tmp_path / "node.toml"
    p.write_text('[node]\ndata_dir = "d"\nopenings_dir = "/mnt/openings"\nopenings_quota_bytes = 1000\n'
                 '[fetch]\nallow = ["127.0.0.1"]\n')
    cfg = load_config(p, env={"POT_FETCH_PROXY": "http://proxy.lan:3128"})
    assert cfg.fetch.allow == ["127.0.0.1"] and cfg.fetch.proxy == "http://proxy.lan:3128"
    assert (
        cfg.openings_store().path.as_posix() == "/mnt/openings" and cfg.openings_store().quota_bytes == 1000
    )
    policy = cfg.fetch.policy()
    assert policy.egress.resolve("127.0.0.1", 80) and policy.proxy == "http://proxy.lan:3128"
    env = load_config(p, env={"POT_FETCH_ALLOW": "10.1.0.0/16, prover.lan", "POT_NODE_OPENINGS_DIR": "o"})
    assert env.fetch.allow == ["10.1.0.0/16", "prover.lan"] and env.openings_dir == tmp_path / "o"
    assert load_config(None, env={}).openings_dir == load_config(None, env={}).data_dir / "openings"
    with pytest.raises(ConfigError, match="fetch.allow"):
        load_config(p, env={"POT_FETCH_ALLOW": "http://x/"})
    with pytest.raises(ConfigError, match="fetch.proxy"):
        load_config(p, env={"POT_FETCH_PROXY": "socks5://x"})
    with pytest.raises(ConfigError, match="openings_dir"):
        load_config(p, env={"POT_NODE_OPENINGS_DIR": "d"})
    with pytest.raises(ConfigError, match="openings_dir"):
        load_config(p, env={"POT_NODE_OPENINGS_DIR": str(tmp_path / "d")})


def test_the_cap_is_exact_without_a_length(serve, tmp_path):
    # No Content-Length: the body ends when the connection does. N bytes pass a cap of N; N+1 do not.
    n = 200_000
    s = serve({"/n": (200, {}, [bytes(n)]), "/n1": (200, {}, [bytes(n), b"\0"])})
    assert fetch_to_file(s.url + "/n", tmp_path / "a", max_bytes=n, policy=OPEN) == n
    with pytest.raises(FetchError) as exc:
        fetch_to_file(s.url + "/n1", tmp_path / "b", max_bytes=n, policy=OPEN)
    assert exc.value.kind == "too_large" and not (tmp_path / "b.part").exists()


def test_https_goes_to_the_checked_address_with_the_name_in_sni(tmp_path):
    # The connection is pinned to the address the policy checked; TLS still names the host (SNI)
    # and checks the certificate against it: a self-signed one is refused.
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=prover.test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    names: list = []
    ctx.sni_callback = lambda sock, name, c: names.append(name)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)
    port = srv.getsockname()[1]

    def accept():
        conn, _ = srv.accept()
        try:
            ctx.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    policy = FetchPolicy(
        **{**FAST, "attempts": 1},
        egress=EgressPolicy.from_allow(["prover.test"], resolver=lambda host, p: ["127.0.0.1"]),
    )
    try:
        with pytest.raises(FetchError) as exc:
            fetch_bytes(f"https://prover.test:{port}/runs/x/leaves", max_bytes=100, policy=policy)
        assert "CERTIFICATE_VERIFY_FAILED" in exc.value.reason or "certificate" in exc.value.reason.lower()
        assert names == ["prover.test"]
    finally:
        srv.close()
