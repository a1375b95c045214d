"""One miner cannot starve another through what the node's downloads share: name lookups run on
per-miner slots with deadlines, every spelling of a server is one owner of the endpoint cap, every
IPv6 form that embeds a forbidden IPv4 address is refused, an allow-list cannot open the internal
space by accident, one miner's downloads hold at most their share of the openings disk, and a
fetch that failed for a reason that may pass is tried again inside its window before the node
reveals the refusal."""

from __future__ import annotations

import http.server
import ipaddress
import threading
import time

import pytest
import sqlalchemy as sa

from challenges.opening import build_opening, load_opening
from commitments import merkle
from node.config import NodeConfig
from node.db import challenges, runs, stage_log
from node.egress import EgressPolicy, EgressRefused, ResolverSlots, embedded_v4, forbidden, parse_allow
from node.fetch import FetchError, FetchPolicy, OpeningsStore, ShareFull, endpoint_owners, fetch_to_file
from node.scheduler import BlockClock, Budgets, InFlight
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk
from tests.node.harness import in_process_node

# --- the resolver: per-miner slots with deadlines ------------------------------------------------


class StallingResolver:
    """Names starting with "stall" never answer until released; the others answer 127.0.0.1 at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host.startswith("stall"):
            self.release.wait(30)
            return ["127.0.0.1"]
        return ["127.0.0.1"]


def test_a_stalling_miner_holds_only_its_own_lookup_slots():
    resolver = StallingResolver()
    slots = ResolverSlots(per_owner=2, total=16)
    policy = EgressPolicy.from_allow(["127.0.0.1"], resolver=resolver, dns_timeout_s=1.5, slots=slots)
    errors: list[EgressRefused] = []

    def stall(i: int) -> None:
        try:
            policy.resolve(f"stall{i}.a.example", 80, "miner:a")
        except EgressRefused as exc:
            errors.append(exc)

    # Six stalled lookups of miner A at once: more than the old shared pool's four threads.
    threads = [threading.Thread(target=stall, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 5
        while slots.busy("miner:a") < 2:
            assert time.monotonic() < deadline, "miner A's lookups never started"
            time.sleep(0.01)
        # Miner B's lookups while A's slots are all stalled: each answers at once.
        latencies = []
        for i in range(20):
            started = time.monotonic()
            assert policy.resolve(f"prover{i}.b.example", 80, "miner:b") == [
                ipaddress.ip_address("127.0.0.1")
            ]
            latencies.append(time.monotonic() - started)
        assert max(latencies) < 0.5, latencies
        # A never holds more than its own two threads, whatever it asks for.
        assert slots.busy("miner:a") == 2 and slots.busy() == 2
        for t in threads:
            t.join(10)
        # Every one of A's lookups ended by its deadline: two abandoned, four never given a slot.
        assert len(errors) == 6 and all(e.retryable for e in errors)
        assert sum("did not resolve within 1.5 s" in e.reason for e in errors) == 2
        assert sum("lookup slot(s) are all held" in e.reason for e in errors) == 4
        # The abandoned threads still count against A (and only A) until they end.
        assert slots.busy("miner:a") == 2 and slots.busy("miner:b") == 0
    finally:
        resolver.release.set()
    deadline = time.monotonic() + 5
    while slots.busy():
        assert time.monotonic() < deadline, "the released lookups never ended"
        time.sleep(0.01)
    assert policy.resolve("stall-again.a.example", 80, "miner:a")  # A's slots are its own again


def test_the_total_bounds_the_lookup_threads_of_all_miners():
    resolver = StallingResolver()
    slots = ResolverSlots(per_owner=2, total=3)
    policy = EgressPolicy.from_allow(["127.0.0.1"], resolver=resolver, dns_timeout_s=0.3, slots=slots)
    try:
        for miner in ("a", "b", "c"):
            for i in range(2):
                with pytest.raises(EgressRefused):
                    policy.resolve(f"stall{i}.{miner}.example", 80, f"miner:{miner}")
        assert slots.busy() == 3  # never more than the total, abandoned threads included
        with pytest.raises(EgressRefused, match="all 3 lookup slots of the node are held"):
            policy.resolve("fine.d.example", 80, "miner:d")
    finally:
        resolver.release.set()


def test_resolver_slots_refuse_impossible_sizes():
    with pytest.raises(ValueError, match="per_owner"):
        ResolverSlots(per_owner=0)
    with pytest.raises(ValueError, match="per_owner"):
        ResolverSlots(per_owner=4, total=2)


# --- one owner key per server --------------------------------------------------------------------


def test_spellings_of_one_server_are_one_owner():
    names = ["http://Prover.Example/o", "http://prover.example./o", "http://PROVER.EXAMPLE:80/x",
             "http://prover.example:80", "https://prover.example:80/o"]
    assert {endpoint_owners(u)[0] for u in names} == {"endpoint:prover.example:80"}
    assert endpoint_owners("https://prover.example/o") == ("endpoint:prover.example:443",)
    assert endpoint_owners("http://BÜCHER.example/o") == ("endpoint:xn--bcher-kva.example:80",)
    v4 = ["http://93.184.216.34/o", "http://93.184.216.34:80/o", "http://[::ffff:93.184.216.34]/o",
          "http://[::FFFF:5DB8:D822]:80/o", "http://[0:0:0:0:0:ffff:93.184.216.34]/o"]
    assert {endpoint_owners(u) for u in v4} == {("endpoint:93.184.216.34:80", "addr:93.184.216.34:80")}
    v6 = ["http://[2606:2800:220:1:248:1893:25C8:1946]/o", "http://[2606:2800:220:1:248:1893:25c8:1946]:80/",
          "http://[2606:2800:0220:0001:0248:1893:25c8:1946]/o"]
    assert len({endpoint_owners(u) for u in v6}) == 1
    # A name counts with the addresses it last resolved to: an IP literal of one of them shares its key.
    named = endpoint_owners("http://prover.example/o", lambda host: ["93.184.216.34", "::ffff:93.184.216.34"])
    assert named == ("endpoint:prover.example:80", "addr:93.184.216.34:80")
    cap = InFlight(1)
    cap.add(("miner:a", *named))
    assert not cap.admits(("miner:b", *endpoint_owners("http://[::ffff:93.184.216.34]/other")))
    assert cap.admits(("miner:b", *endpoint_owners("http://93.184.216.35/o")))
    assert endpoint_owners("") == endpoint_owners("ftp://x/y") == endpoint_owners("http:///o") == ()


def test_the_daemon_counts_a_name_and_its_address_against_one_endpoint(tmp_path):
    node, engine = in_process_node(tmp_path, tmp_path / "c.db")
    try:
        node.policy.egress.slots._seen["prover.example"] = ("198.51.100.7",)

        class Job:
            miner = "a"
            opening_uri = "http://PROVER.example./o"
            endpoint = ""

        class Other(Job):
            miner = "b"
            opening_uri = "http://198.51.100.7:80/o"

        node.in_flight.add(node._owners(Job))
        node.in_flight.add(node._owners(Job))
        assert not node.in_flight.admits(node._owners(Other)), node._owners(Other)
    finally:
        node.shutdown()
        engine.dispose()


# --- IPv6 forms that embed an IPv4 address -------------------------------------------------------

FORMS = {
    "IPv4-mapped": lambda v: f"::ffff:{v}",
    "IPv4-translated (SIIT)": lambda v: f"::ffff:0:{v}",
    "NAT64": lambda v: f"64:ff9b::{v}",
    "local-use NAT64": lambda v: _rfc6052_48("64:ff9b:1::", v),
    "6to4": lambda v: str(ipaddress.IPv6Address((0x2002 << 112) | int(ipaddress.IPv4Address(v)) << 80 | 1)),
    "Teredo": lambda v: str(ipaddress.IPv6Address(
        (0x20010000 << 96) | (0x4136E378 << 64) | (~int(ipaddress.IPv4Address(v)) & 0xFFFFFFFF))),
    "IPv4-compatible": lambda v: f"::{v}",
}


def _rfc6052_48(prefix: str, v4: str) -> str:
    n, v = int(ipaddress.IPv6Address(prefix)), int(ipaddress.IPv4Address(v4))
    return str(ipaddress.IPv6Address(n | (v >> 16) << 64 | (v & 0xFFFF) << 40))


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("v4", ["169.254.169.254", "127.0.0.1", "10.0.0.1"])
def test_every_form_embedding_a_forbidden_ipv4_is_refused(form, v4):
    ip = ipaddress.ip_address(FORMS[form](v4))
    assert embedded_v4(ip) == ipaddress.IPv4Address(v4)
    why = forbidden(ip)
    assert why is not None and form in why, why
    with pytest.raises(EgressRefused, match="outside the allow-list"):
        EgressPolicy().resolve(f"[{ip}]", 80)


@pytest.mark.parametrize("form", ["IPv4-mapped", "IPv4-translated (SIIT)", "NAT64", "6to4"])
def test_a_public_ipv4_is_allowed_in_its_translated_forms(form):
    ip = ipaddress.ip_address(FORMS[form]("93.184.216.34"))
    assert forbidden(ipaddress.ip_address("93.184.216.34")) is None and forbidden(ip) is None
    assert EgressPolicy().resolve(f"[{ip}]", 80) == [ip]


@pytest.mark.parametrize("form", ["IPv4-compatible", "Teredo", "local-use NAT64"])
def test_deprecated_and_local_forms_are_refused_whatever_they_embed(form):
    assert (
        forbidden(ipaddress.ip_address(FORMS[form]("93.184.216.34"))) == f"{form} (embedding 93.184.216.34)"
    )


def test_an_allowed_ipv4_network_opens_its_translated_forms_only():
    policy = EgressPolicy.from_allow(["10.1.0.0/16"])
    assert policy.resolve("[::ffff:0:10.1.2.3]", 80) == [ipaddress.ip_address("::ffff:0:10.1.2.3")]
    with pytest.raises(EgressRefused):
        policy.resolve(f"[{FORMS['Teredo']('10.1.2.3')}]", 80)
    with pytest.raises(EgressRefused):
        policy.resolve("[::ffff:0:10.2.0.1]", 80)


def test_a_name_resolving_to_the_siit_form_of_the_metadata_address_is_refused():
    policy = EgressPolicy(resolver=lambda host, port: ["93.184.216.34", "::ffff:0:a9fe:a9fe"],
                          slots=ResolverSlots())
    with pytest.raises(EgressRefused, match=r"link-local \(cloud metadata\) \(as IPv4-translated"):
        policy.resolve("rebinding.example", 80)


# --- allow-lists that open too much -----------------------------------------------------------------


@pytest.mark.parametrize("entry,why", [
    ("0.0.0.0/0", "a /0 network, broader than /8"), ("::/0", "a /0 network, broader than /16"),
    ("128.0.0.0/1", "broader than /8"), ("10.0.0.0/7", "broader than /8"), ("2000::/3", "broader than /16"),
    ("::ffff:0:0/96", "IPv4-mapped prefix"), ("::/16", "IPv4-mapped prefix"), ("2002::/16", "6to4 prefix"),
    ("64:ff9b::/96", "NAT64 prefix"),
])
def test_an_allow_list_network_covering_the_internal_space_is_refused(entry, why):
    with pytest.raises(
        ValueError, match=rf"allow-list entry '{entry}' is too broad: .*{why}.*fetch.allow_broad"
    ):
        parse_allow([entry])
    nets, _ = parse_allow([entry], broad=True)  # the explicit opt-in
    assert nets == (ipaddress.ip_network(entry),)


def test_narrow_networks_still_pass():
    nets, names = parse_allow(["10.0.0.0/8", "127.0.0.1", "fd00::/16", "64:ff9b::a00:0/104", "prover.lan"])
    assert len(nets) == 4 and names == {"prover.lan"}


def test_the_config_names_a_broad_entry_and_takes_the_opt_in():
    with pytest.raises(ValueError, match=r"(?s)fetch.allow.*'0.0.0.0/0' is too broad"):
        NodeConfig.model_validate({"chain": {"account": "v1"}, "fetch": {"allow": ["0.0.0.0/0"]}})
    cfg = NodeConfig.model_validate({"chain": {"account": "v1"},
                                     "fetch": {"allow": ["0.0.0.0/0"], "allow_broad": True}})
    assert cfg.fetch.policy().egress.allow_networks == (ipaddress.ip_network("0.0.0.0/0"),)


# --- one miner's share of the openings disk --------------------------------------------------------


class _Body(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def body_server():
    handlers = {}

    def make(body: bytes) -> str:
        h = type("H", (_Body,), {"body": body})
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), h)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        handlers[httpd] = h
        return f"http://127.0.0.1:{httpd.server_address[1]}/o"

    yield make
    for httpd in handlers:
        httpd.shutdown()
        httpd.server_close()


OPEN = FetchPolicy(connect_timeout_s=2, read_timeout_s=2, total_timeout_s=10, attempts=1,
                   egress=EgressPolicy.from_allow(["127.0.0.1"]))


def test_one_miners_downloads_hold_at_most_its_share(body_server, tmp_path):
    store = OpeningsStore(tmp_path, quota_bytes=10_000, miner_share=0.4)  # 4,000 bytes a miner
    (tmp_path / "aa.opening").write_bytes(bytes(3_000))  # miner A's earlier challenge
    a = store.for_miner("miner:a", ["aa", "ab", "ac"])
    # An opening that alone passes the share: refused (no room will ever come for it), nothing kept.
    with pytest.raises(FetchError, match="over the 4000 bytes one miner's downloads may hold"):
        fetch_to_file(body_server(bytes(4_500)), tmp_path / "ab.opening", max_bytes=1 << 20, policy=OPEN,
                      room=a.room_for(tmp_path / "ab.opening"))
    assert not (tmp_path / "ab.opening").exists() and not (tmp_path / "ab.opening.part").exists()
    # One that fits alone but not beside A's other file: A waits.
    with pytest.raises(ShareFull, match="miner:a's downloads hold 3000 bytes; 1500 more"):
        fetch_to_file(body_server(bytes(1_500)), tmp_path / "ac.opening", max_bytes=1 << 20, policy=OPEN,
                      room=a.room_for(tmp_path / "ac.opening"))
    # Miner B's download of the same size goes ahead: the folder is under its quota.
    b = store.for_miner("miner:b", ["ba"])
    assert fetch_to_file(body_server(bytes(1_500)), tmp_path / "ba.opening", max_bytes=1 << 20, policy=OPEN,
                         room=b.room_for(tmp_path / "ba.opening")) == 1_500
    # A small one of A still fits its share.
    assert fetch_to_file(body_server(bytes(900)), tmp_path / "ac.opening", max_bytes=1 << 20, policy=OPEN,
                         room=a.room_for(tmp_path / "ac.opening")) == 900


def test_the_fetch_stage_refuses_an_opening_over_the_share_and_waits_beside_the_miners_files(
    body_server, tmp_path
):
    from node.pipeline import stage_fetch

    store = OpeningsStore(tmp_path, quota_bytes=10_000, miner_share=0.3)  # 3,000 bytes a miner

    def fetch(body: bytes, cid: str, share):
        return stage_fetch(
            uri=body_server(body),
            endpoint="",
            run_id=RUN_ID,
            dest=tmp_path / f"{cid}.opening",
            leaves_dest=None,
            max_opening_bytes=1 << 20,
            max_leaves_bytes=1 << 20,
            policy=OPEN,
            store=share,
            owner="miner:a",
        )

    out = fetch(bytes(3_500), "aa", store.for_miner("miner:a", ["aa", "ab"]))
    assert not out.ok and out.refusal_class == "unavailable" and out.data["retryable"] is False
    assert out.reason.startswith("too_large: 3500 bytes for one challenge of miner:a")
    (tmp_path / "ab.opening").write_bytes(bytes(2_000))
    with pytest.raises(ShareFull):
        fetch(bytes(1_500), "aa", store.for_miner("miner:a", ["aa", "ab"]))
    assert not store._pending  # the stage gave its reservations back
    assert fetch(bytes(1_500), "ba", store.for_miner("miner:b", ["ba"])).ok


def test_a_miners_downloads_running_at_once_cannot_pass_its_share_together(tmp_path):
    store = OpeningsStore(tmp_path, quota_bytes=10_000, miner_share=0.4)
    first = store.for_miner("miner:a", ["aa", "ab"])
    second = store.for_miner("miner:a", ["aa", "ab"])
    first.room(3_000, tmp_path / "aa.opening")  # announced, nothing written yet
    with pytest.raises(ShareFull):
        second.room(3_000, tmp_path / "ab.opening")
    store.for_miner("miner:b", ["ba"]).room(3_000, tmp_path / "ba.opening")  # another miner: its own share
    first.release()
    second.room(3_000, tmp_path / "ab.opening")
    with pytest.raises(ValueError, match="miner_share"):
        OpeningsStore(tmp_path, miner_share=0)


# --- retried within the window before the refusal ---------------------------------------------------


def test_retries_stop_at_the_latest_safe_moment():
    budgets = Budgets(
        margin_blocks=2,
        fetch_share=0.5,
        fetch_max_s=900,
        validate_max_s=60,
        losschecks_max_s=60,
        replay_max_s=600,
    )
    clock = BlockClock(1.0)
    from commitments.retry import Backoff

    wide = Backoff(100.0, 100.0)  # a delay far past the window: cut to the latest useful start
    delay = budgets.retry_delay(head=0, commit_deadline=22, clock=clock, attempt=3, backoff=wide, min_s=4.0)
    assert delay is not None and delay <= 20 - 4 / 0.5
    assert budgets.budget("fetch", head=int(delay), commit_deadline=22, clock=clock) >= 4.0
    # Too little left for a retry's budget: the failure stands now.
    assert (
        budgets.retry_delay(head=13, commit_deadline=22, clock=clock, attempt=0, backoff=wide, min_s=4.0)
        is None
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return walk(tiny_spec(3), corpus(tmp_path_factory.mktemp("data")))


class FlakyProver:
    """A real prover of one opening that answers 503 to its first `fail` requests, then serves."""

    def __init__(self, data: bytes, fail: int) -> None:
        self.requests = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                if self.path != "/o" or outer.requests <= fail:
                    self.send_response(503 if self.path == "/o" else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _fetch_job(tmp_path, run, prover: FlakyProver, commit_deadline: int):
    data = build_opening(spec=run.spec, run_id=RUN_ID, step=2, pre_state=run.states[1], dataset=run.dataset,
                         schedule=run.schedule, leaves=run.leaves)
    node, engine = in_process_node(
        tmp_path,
        tmp_path / "c.db",
        '[fetch]\nallow = ["127.0.0.1"]\nattempts = 1\n'
        'connect_timeout_s = 1.0\n[schedule]\nblock_time_s = 1.0\n',
    )
    node.head = 100
    cid = b"\x42" * 32
    now = time.time()
    with engine.begin() as c:
        c.execute(
            runs.insert().values(
                run_id=RUN_ID,
                miner="flaky",
                spec_digest=run.spec.digest(),
                mode="value",
                declared_steps=3,
                endpoint=prover.url,
                initial_hash=run.states[0].digest(),
                schedule_commitment=run.schedule.commitment,
                dataset_hash=run.dataset.dataset_hash,
                registered_block=1,
                slashed=0,
            )
        )
        c.execute(
            challenges.insert().values(
                challenge_id=cid,
                run_id=RUN_ID,
                idx=0,
                step=2,
                root=merkle.root(run.leaves),
                size=len(run.leaves),
                mode="value",
                endpoint=prover.url,
                issued_block=90,
                opening_deadline=100,
                commit_deadline=commit_deadline,
                reveal_deadline=commit_deadline + 10,
                stage="fetch",
                opening_uri=f"{prover.url}/o",
                opening_digest=load_opening(data).digest,
                attempts=0,
                next_attempt_at=0.0,
                created_at=now,
                updated_at=now,
            )
        )
    return node, engine, cid


def _job(engine, cid):
    with engine.connect() as c:
        return c.execute(sa.select(challenges).where(challenges.c.challenge_id == cid)).one()


def _drive(node, engine, cid, until, *, advance_head: int = 0, timeout: float = 60.0):
    """The daemon's loop (schedule, collect), moving the head on `advance_head` blocks per fetch failure."""
    deadline = time.monotonic() + timeout
    seen = 0
    while not until(_job(engine, cid)):
        assert time.monotonic() < deadline, f"the job did not settle: {_job(engine, cid)}"
        node.schedule()
        node.collect()
        if advance_head and node.fetch_retries.get(cid, 0) > seen:
            seen = node.fetch_retries[cid]
            node.head += advance_head
        time.sleep(0.02)


def test_a_starved_fetch_is_retried_within_its_window_and_then_served(tmp_path, run):
    data = build_opening(spec=run.spec, run_id=RUN_ID, step=2, pre_state=run.states[1], dataset=run.dataset,
                         schedule=run.schedule, leaves=run.leaves)
    prover = FlakyProver(data, fail=2)
    node, engine, cid = _fetch_job(tmp_path, run, prover, commit_deadline=200)
    try:
        _drive(node, engine, cid, lambda j: j.stage != "fetch")
        job = _job(engine, cid)
        # Two 503s, then the opening: the node never took the refusal.
        assert job.stage == "validate" and job.refusal_class is None and job.refusal_reason is None
        assert prover.requests >= 3
        with engine.connect() as c:
            rows = [r.detail for r in c.execute(sa.select(stage_log).where(stage_log.c.challenge_id == cid))]
        assert sum("retried in" in (d or "") for d in rows) == 2 and "HTTP 503" in rows[0]
        assert rows[-1].startswith(f"{len(data)} bytes from {prover.url}/o")
    finally:
        node.shutdown()
        engine.dispose()
        prover.close()


def test_a_failure_that_lasts_is_refused_at_the_latest_safe_moment(tmp_path, run):
    prover = FlakyProver(b"never", fail=10**6)
    # 14 blocks of 1 s left, 2 kept for the commit: retries while a fetch can still get 1 s, i.e.
    # up to block 110; three blocks pass with each failed try.
    node, engine, cid = _fetch_job(tmp_path, run, prover, commit_deadline=114)
    try:
        _drive(node, engine, cid, lambda j: j.stage != "fetch", advance_head=3)
        job = _job(engine, cid)
        assert (
            job.stage == "witness" and job.refusal_class == "unavailable" and "HTTP 503" in job.refusal_reason
        )
        assert prover.requests == 4, "refused without retrying, or retried past the window"
        assert "retried until the commit window's last safe moment" in job.refusal_reason
        # It left the fetch while the window still had its commit margin, never as missed.
        assert node.head <= job.commit_deadline - 2
    finally:
        node.shutdown()
        engine.dispose()
        prover.close()


def test_a_failure_that_cannot_pass_is_refused_at_once(tmp_path, run):
    prover = FlakyProver(b"", fail=0)  # 404 for anything but /o; the job asks for /missing
    node, engine, cid = _fetch_job(tmp_path, run, prover, commit_deadline=200)
    with engine.begin() as c:
        c.execute(sa.update(challenges).values(opening_uri=f"{prover.url}/missing"))
    try:
        _drive(node, engine, cid, lambda j: j.stage != "fetch")
        job = _job(engine, cid)
        assert (
            job.stage == "witness" and job.refusal_class == "unavailable" and "HTTP 404" in job.refusal_reason
        )
        assert prover.requests == 1 and cid not in node.fetch_retries
    finally:
        node.shutdown()
        engine.dispose()
        prover.close()
