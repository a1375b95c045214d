"""Hostile-input probes, second round: one miner starving a resource every miner shares (resolver,
fetch slots, disk). Registered in devnet.hostile."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from urllib.parse import urlsplit

from devnet.forge import max_opening_bytes
from devnet.hostile import _Connects, _fetch, _honest_facts, config_refusal, probe
from devnet.lab import Lab
from node.daemon import VerifierNode
from node.egress import EgressPolicy, ResolverSlots
from node.fetch import FetchPolicy
from node.pipeline import stage_fetch
from node.scheduler import InFlight

KIND = "a miner starving a shared resource"
# The staller's lookups each wait this long before they are abandoned; the honest fetch must end well before.
STALL_DNS_S = 3.0
STALLED_FETCHES = 6  # more than the four threads every miner once shared


class _StallingResolver:
    """Names under .stall.test never answer (until released); every other name is the lab's prover."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, host: str, port: int) -> list[str]:
        if host.endswith(".stall.test"):
            self.release.wait(60)
            return ["192.0.2.1"]
        return ["127.0.0.1"]


@probe("dns-staller-one-miner", KIND,
       "fetch another miner's opening in time while one miner's names never resolve (that miner's lookups "
       "hold its own resolver slots only)")
def _dns_staller(lab: Lab) -> tuple[bool, str, str]:
    resolver = _StallingResolver()
    slots = ResolverSlots()  # the node's sizes, apart from the process's shared set
    policy = FetchPolicy(connect_timeout_s=STALL_DNS_S, read_timeout_s=10, total_timeout_s=30, attempts=1,
                         egress=EgressPolicy.from_allow(["127.0.0.1"], resolver=resolver,
                                                        dns_timeout_s=STALL_DNS_S, slots=slots))
    port = urlsplit(lab.prover.endpoint).port
    honest_uri = f"http://prover.honest.test:{port}/openings/isolation-honest"
    lab.prover.put("/openings/isolation-honest", lab.opening())
    staller: list = []

    def stall(i: int) -> None:
        dest = lab.dir / "verifier" / f"stall-{i}.opening"
        staller.append(
            stage_fetch(
                uri=f"http://p{i}.stall.test:{port}/openings/x",
                endpoint="",
                run_id=lab.honest.run_id,
                dest=dest,
                leaves_dest=None,
                max_opening_bytes=max_opening_bytes(lab),
                max_leaves_bytes=1 << 20,
                policy=policy,
                facts=_honest_facts(lab),
                owner="miner:staller",
            )
        )

    threads = [threading.Thread(target=stall, args=(i,), daemon=True) for i in range(STALLED_FETCHES)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while slots.busy("miner:staller") < slots.per_owner and time.monotonic() < deadline:
            time.sleep(0.01)
        held = slots.busy("miner:staller")
        started = time.monotonic()
        out = stage_fetch(uri=honest_uri, endpoint="", run_id=lab.honest.run_id,
                          dest=lab.dir / "verifier" / "isolation-honest.opening", leaves_dest=None,
                          max_opening_bytes=max_opening_bytes(lab), max_leaves_bytes=1 << 20, policy=policy,
                          facts=_honest_facts(lab), owner="miner:honest")
        took = time.monotonic() - started
        peak = slots.busy("miner:staller")
        for t in threads:
            t.join(STALL_DNS_S + 10)
    finally:
        resolver.release.set()
    if held < slots.per_owner:
        return (
            False,
            "fetch",
            f"the staller's lookups never held its slots ({held}): the probe proves nothing",
        )
    if not out.ok:
        return (
            False,
            "fetch",
            f"the honest opening was refused while another miner stalled: [{out.refusal_class}] "
            f"{out.reason[:120]}",
        )
    if took > STALL_DNS_S / 2:
        return False, "fetch", f"the honest fetch took {took:.2f} s behind the staller's lookups"
    if peak > slots.per_owner:
        return False, "fetch", f"the staller held {peak} lookup threads, over its {slots.per_owner}"
    stalled = [o for o in staller if not o.ok and "dns:" in (o.reason or "")]
    if len(stalled) != STALLED_FETCHES or not all(o.data.get("retryable") for o in stalled):
        return (
            False,
            "fetch",
            f"{len(stalled)} of the staller's {STALLED_FETCHES} fetches ended as a lookup failure "
            "that may pass",
        )
    return (
        True,
        "fetch",
        (
            f"the honest opening fetched in {took:.2f} s while {STALLED_FETCHES} stalled fetches held "
            f"{held} lookup slots of their own miner; each ended [unavailable] by its {STALL_DNS_S:g} s "
            "deadline"
        ),
    )


def _siit_targets() -> list[tuple[str, str]]:
    """(label, host) of IPv6 spellings of forbidden IPv4 addresses, the SIIT form first."""
    return [("SIIT metadata", "[::ffff:0:169.254.169.254]"), ("SIIT loopback", "[::ffff:0:127.0.0.1]"),
            ("SIIT private", "[::ffff:0:10.0.0.1]"), ("NAT64 metadata", "[64:ff9b::169.254.169.254]"),
            ("6to4 loopback", "[2002:7f00:1::1]"), ("compatible metadata", "[::169.254.169.254]"),
            ("Teredo private", "[2001:0:4136:e378:8000:63bf:f5ff:fffe]")]


@probe(
    "siit-metadata-address",
    KIND,
    "refuse the IPv4-translated (SIIT) and every other IPv6 form of a forbidden IPv4 address, as an address "
    "and as a name's answer, without connecting",
)
def _siit(lab: Lab) -> tuple[bool, str, str]:
    bad, seen_classes = [], set()
    with _Connects() as seen:
        for label, host in _siit_targets():
            out = _fetch(
                lab,
                f"http://{host}/latest/meta-data/",
                f"siit-{label.split()[0]}-{label.split()[1]}",
                loopback_allowed=False,
            )
            seen_classes.add(out.refusal_class)
            if out.ok or not (out.reason or "").startswith("refused_address"):
                bad.append(f"{label}: {'fetched' if out.ok else out.reason[:80]}")
        # A name whose answer is the SIIT form of the metadata address, beside a public one.
        policy = FetchPolicy(connect_timeout_s=1, attempts=1, egress=EgressPolicy(
            resolver=lambda h, p: ["93.184.216.34", "::ffff:0:a9fe:a9fe"], slots=ResolverSlots()))
        out = stage_fetch(
            uri="http://rebind.example/latest/meta-data/",
            endpoint="",
            run_id=lab.honest.run_id,
            dest=lab.dir / "verifier" / "siit-name.opening",
            leaves_dest=None,
            max_opening_bytes=max_opening_bytes(lab),
            max_leaves_bytes=1 << 20,
            policy=policy,
            facts=_honest_facts(lab),
            owner="miner:siit",
        )
        seen_classes.add(out.refusal_class)
        if out.ok or "cloud metadata" not in (out.reason or ""):
            bad.append(f"a name answering ::ffff:0:a9fe:a9fe: {'fetched' if out.ok else out.reason[:80]}")
    if seen:
        bad.append(f"connected to {[a for a, _p in seen][:3]}")
    if bad:
        return False, "fetch", "; ".join(bad)
    if seen_classes != {"unavailable"}:
        return False, "fetch", f"refused with the classes {sorted(map(str, seen_classes))}"
    return (
        True,
        "fetch",
        f"{len(_siit_targets()) + 1} IPv6 forms refused before any connection, each [unavailable]",
    )


@probe(
    "endpoint-spellings-one-owner",
    KIND,
    "count every spelling of one prover server (case, trailing dot, default port, IPv4-mapped and translated "
    "forms, a name resolving to it) against one endpoint cap",
)
def _spellings(lab: Lab) -> tuple[bool, str, str]:
    port = urlsplit(lab.prover.endpoint).port
    policy = FetchPolicy(egress=EgressPolicy.from_allow(["127.0.0.1"], resolver=lambda h, p: ["127.0.0.1"],
                                                        slots=ResolverSlots()))
    # The name resolves once (as a fetch would), so the scheduler knows where it points.
    policy.egress.resolve("prover.spelling.test", port, "miner:a")
    node = SimpleNamespace(policy=policy)  # what the daemon's owner rule reads of the node
    spellings = [f"http://127.0.0.1:{port}/openings/x", f"http://[::ffff:127.0.0.1]:{port}/o",
                 f"http://[::FFFF:7F00:0001]:{port}/o", f"http://[::ffff:0:127.0.0.1]:{port}/o",
                 f"http://PROVER.Spelling.TEST.:{port}/o", f"http://prover.spelling.test:{port}/o"]
    defaults = ["http://prover.spelling.test/o", "http://Prover.Spelling.Test:80/o", "http://prover.spelling.test.:80"]
    bad = []
    for group in (spellings, defaults):
        jobs = [SimpleNamespace(miner=f"m{i}", opening_uri=u, endpoint="") for i, u in enumerate(group)]
        cap = InFlight(1)
        cap.add(VerifierNode._owners(node, jobs[0]))  # type: ignore[arg-type]
        admitted = [j.opening_uri for j in jobs[1:] if cap.admits(VerifierNode._owners(node, j))]  # type: ignore[arg-type]
        if admitted:
            bad.append(f"admitted beside {jobs[0].opening_uri}: {admitted}")
    other = SimpleNamespace(miner="m9", opening_uri=f"http://127.0.0.2:{port}/o", endpoint="")
    cap = InFlight(1)
    cap.add(VerifierNode._owners(node, SimpleNamespace(miner="m0", opening_uri=spellings[0], endpoint="")))  # type: ignore[arg-type]
    if not cap.admits(VerifierNode._owners(node, other)):  # type: ignore[arg-type]
        bad.append("another server was counted as the same one")
    if bad:
        return False, "fetch", "; ".join(bad)
    return (
        True,
        "fetch",
        (
            f"{len(spellings)} spellings of 127.0.0.1:{port} and {len(defaults)} of a name on its "
            "default port each counted as one server (cap 1: every other spelling waited)"
        ),
    )


@probe(
    "broad-allow-list-refused",
    "a hostile endpoint or prover",
    "refuse a fetch.allow entry that covers the internal address space (0.0.0.0/0, ::/0, a /4), naming it, "
    "unless fetch.allow_broad opts in; a narrow entry still loads",
)
def _broad_allow(lab: Lab) -> tuple[bool, str, str]:
    from node.config import load_config

    folder = lab.dir / "hostile" / "allow"
    folder.mkdir(parents=True, exist_ok=True)
    bad = []
    for i, entry in enumerate(("0.0.0.0/0", "::/0", "0.0.0.0/4", "::ffff:0:0/96")):
        problem = config_refusal(
            folder / f"broad-{i}.toml", f'[fetch]\nallow = ["{entry}"]\n'.encode(), entry
        )
        if problem is not None:
            bad.append(f"{entry}: {problem}")
    for name, text in (("a narrow entry", '[fetch]\nallow = ["10.1.2.0/24"]\n'),
                       ("the opt-in", '[fetch]\nallow = ["0.0.0.0/0"]\nallow_broad = true\n')):
        path = folder / f"{name.replace(' ', '-')}.toml"
        path.write_text(text)
        try:
            load_config(path, env={})
        except BaseException as exc:  # noqa: BLE001
            bad.append(f"{name} was refused: {type(exc).__name__}: {str(exc)[:120]}")
    if bad:
        return False, "config", "; ".join(bad)
    return True, "config", "every broad entry is a ConfigError naming it; a narrow entry and the opt-in load"
