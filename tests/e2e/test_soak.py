"""Soak: a verifier node on a dev chain that carries a steady mix of hostile remarks (among them
configure_network records by a stranger, out of range and in range) and hostile provers
(slowloris, a trickled body, an oversized body, a redirect to an internal address, a gzip bomb,
a leaf list and a manifest of 8 MiB of empty arrays, and endpoint names whose DNS never answers)
beside honest runs, for a few minutes. Every honest challenge must still resolve honest, in its
windows; the node's cursor must keep up with the head, its parameters stay the network's, and its
memory and disk must stay bounded. The figures are printed (run with -s) and logged. `POT_SOAK_S`
sets the soak's length (default 150 s).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import sqlite3
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from chain import protocol as P
from chain.calls import (
    BondVerifier,
    ConfigureNetwork,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    derive_run_id,
    encode_call,
)
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from chain.view import ChainView
from challenges.opening import MAGIC, build_opening, encode_leaves, load_opening
from commitments import cbor, merkle
from commitments.hashing import digest
from commitments.spec import Spec
from devnet import hostile
from devnet.lab import Prover, Serve
from tests.e2e import dns
from tests.miner.helpers import corpus, tiny_spec, walk
from tests.node.harness import Network

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
log = logging.getLogger(__name__)

STEPS = 6
PARAMS = ProtocolParams(challenges_per_run=1, challenge_delay=1, opening_deadline=8, commit_window=30,
                        reveal_window=10, quorum_min_reveals=1, forced_challenge_steps=(4,))
INTERVAL_S = 0.5
SOAK_S = float(os.environ.get("POT_SOAK_S", "150"))
HONEST_EVERY_S = 12.0
HOSTILE_RUN_EVERY_S = 9.0
REMARK_EVERY_S = 1.5
# An honest challenge resolves ~50 blocks (25 s) after it is issued; what is left then may drain.
DRAIN_S = 75.0
# Bounds: the cursor within 20 blocks (10 s) of the head, and back within 4 once the soak stops; the
# node's RSS (daemon + replay workers) and its data folder.
MAX_LAG_BLOCKS = 20
FINAL_LAG_BLOCKS = 4
STUCK_S = 25.0  # a lag over the bound for this long ends the soak early: the cursor is stuck
MAX_RSS_MIB = 1200
MAX_RSS_GROWTH_MIB = 200  # last third of the soak over its first third
MAX_DISK_MIB = 96
AMPLIFIED_BYTES = 8 << 20  # a leaf list or manifest of this many one-byte empty arrays
STALL_DOMAIN = "soak.test"  # names under it go to the silent name server


def empty_arrays(n: int) -> bytes:
    """A canonical CBOR array of `n` empty arrays: one byte of input per item decoded."""
    return hostile._head(4, n) + b"\x80" * n


def stranger_records() -> list[bytes]:
    """configure_network records by a stranger to the network: the defaults with no slashing (in
    range), and an opening deadline of 2^63 blocks (out of range); neither may take effect."""
    base = ProtocolParams().to_dict()
    lenient = dict(base, slash_amount=0, outlier_penalty=0, no_show_penalty=0)
    huge = dict(base, opening_deadline=1 << 63)
    return [encode_call(ConfigureNetwork(cbor.encode(d), 1 << 30)) for d in (lenient, huge)]


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` and every process below it (the replay workers), from /proc."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def du_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False).stdout
    return int(out.split()[0]) if out.strip() else 0


def node_event_counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
        return dict(c.execute("SELECT name, count(*) FROM chain_events GROUP BY name").fetchall())


def node_cursor(db: Path) -> int | None:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2) as c:
            row = c.execute("SELECT block FROM chain_cursor").fetchone()
        return None if row is None else int(row[0])
    except sqlite3.Error:
        return None


class Soak:
    """The miners around one node: honest runs answered honestly, hostile runs answered from hostile
    provers, and an attacker putting hostile remarks on chain; one responder follows the chain."""

    def __init__(self, net: Network, tmp: Path, *, stall_dns: bool) -> None:
        self.net = net
        self.stall_dns = stall_dns
        self.walk = walk(tiny_spec(STEPS), corpus(tmp))
        self.tree = merkle.MerkleTree.from_leaves(list(self.walk.leaves))
        self.honest: dict[bytes, bytes | None] = {}  # run id -> challenge id
        self.hostile: dict[bytes, str] = {}  # run id -> how its prover misbehaves
        self.hostile_challenges: dict[bytes, str] = {}
        self.verdicts: dict[bytes, str] = {}  # challenge id -> verdict, as the chain resolved it
        self.remarks = 0
        self.expected = {"ignored": 0, "refused": 0}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.prover = Prover()
        self.internal = Prover(host="127.0.0.2")  # what a redirect aims at; nothing may reach it
        self.internal.put("/secret", b"internal")
        self.mallory = DevTransport(net.chain_path, "mallory")
        self.attacker = DevTransport(net.chain_path, "attacker")
        self._lock = threading.Lock()
        self._n = 0
        # 256 MiB of zeros in a few hundred kB, made once.
        self.bomb = gzip.compress(MAGIC + b"\0" * (256 << 20), compresslevel=9)
        self.empty_arrays = empty_arrays(AMPLIFIED_BYTES)
        self.manifest_bomb = MAGIC + struct.pack(">I", len(self.empty_arrays)) + self.empty_arrays

    # --- registrations -------------------------------------------------------------------------
    def _register(self, transport: DevTransport, endpoint: str) -> bytes:
        with self._lock:
            self._n += 1
            nonce = digest("pot/test/soak-nonce/v1", self._n)[:16]
        run_id = derive_run_id(transport.account, nonce)  # a run id is its registering account's own
        w = self.walk
        transport.submit([StartTrainingCommitment(run_id, nonce, w.states[0].digest(), w.schedule.commitment,
                                                  w.dataset.dataset_hash, w.spec.to_cbor(), w.spec.steps, endpoint)])
        transport.submit([SubmitCheckpointRoot(run_id, merkle.root(w.leaves), len(w.leaves), ())])
        return run_id

    def start_honest(self) -> None:
        run_id = self._register(self.net.miner, self.net.endpoint)
        (self.net.served / "leaves" / run_id.hex()).write_bytes(encode_leaves(self.walk.leaves))
        self.honest[run_id] = None

    HOSTILE_KINDS = ("slow-headers", "dns-staller", "slow-body", "leaves-amplified", "oversized", "redirect",
                     "manifest-amplified", "gzip-bomb")

    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in self.HOSTILE_KINDS if k != "dns-staller" or self.stall_dns)

    def start_hostile(self, kind: str) -> None:
        endpoint = self.prover.endpoint
        if kind == "dns-staller":  # a name the node must look up, whose name server never answers
            with self._lock:
                endpoint = f"http://stall-{self._n}.{STALL_DOMAIN}:8080"
        run_id = self._register(self.mallory, endpoint)
        self.hostile[run_id] = kind
        if kind == "leaves-amplified":  # the opening is honest; the leaf list beside it is the payload
            self.prover.put(f"/runs/{run_id.hex()}/leaves", self.empty_arrays)

    def _hostile_serve(self, kind: str, body: bytes) -> Serve:
        if kind == "slow-headers":
            return Serve(body, header_trickle_s=1.0)
        if kind == "slow-body":
            return Serve(body, body_trickle_s=0.5)
        if kind == "oversized":
            return Serve(body + b"\0" * (16 << 20))  # 16 MiB past a ~0.5 MB opening
        if kind == "redirect":
            return Serve(redirect=f"{self.internal.endpoint}/secret")
        if kind == "manifest-amplified":
            return Serve(self.manifest_bomb)
        if kind == "leaves-amplified":
            return Serve(body)
        return Serve(self.bomb, gz=True)

    # --- the responder: one chain view answers every challenge -------------------------------------
    def respond(self) -> None:
        view = ChainView(DevTransport(self.net.chain_path, "responder"), PARAMS, keep_events=False)
        while not self.stop.is_set():
            try:
                events = view.sync()
            except Exception as exc:  # the test's own view meets the same hostile blocks as the node
                self.errors.append(f"the responder's chain view failed at block {view.cursor + 1}: "
                                   f"{type(exc).__name__}: {str(exc)[:200]}")
                return
            for ev in events:
                if isinstance(ev, P.ChallengeIssued) and (ev.run_id in self.honest or ev.run_id in self.hostile):
                    self._answer(ev)
                elif isinstance(ev, P.ChallengeResolved):
                    self.verdicts[ev.challenge_id] = ev.verdict
            self.stop.wait(0.2)

    def _answer(self, ev: P.ChallengeIssued) -> None:
        w = self.walk
        data = build_opening(spec=w.spec, run_id=ev.run_id, step=ev.step, pre_state=w.states[ev.step - 1],
                             dataset=w.dataset, schedule=w.schedule, leaves=w.leaves)
        digest = load_opening(data).digest
        if ev.run_id in self.honest:
            (self.net.served / "openings" / digest.hex()).write_bytes(data)
            uri, sender = f"{self.net.endpoint}/openings/{digest.hex()}", self.net.miner
            self.honest[ev.run_id] = ev.challenge_id
        else:
            kind = self.hostile[ev.run_id]
            if kind == "dns-staller":
                uri = f"http://stall-{ev.challenge_id.hex()[:12]}.{STALL_DOMAIN}:8080/openings/{digest.hex()}"
            else:
                uri = self.prover.serve(f"/openings/{digest.hex()}", self._hostile_serve(kind, data))
            sender = self.mallory
            self.hostile_challenges[ev.challenge_id] = kind
        sender.submit([SubmitOpening(ev.challenge_id, digest, uri, w.leaves[ev.step],
                                     tuple(self.tree.inclusion_proof(ev.step)))], wait=False)

    # --- hostile remarks ---------------------------------------------------------------------------
    def remark_payloads(self) -> list[bytes]:
        d = self.walk.spec.canonical()
        d["profile"] = "torch-native"
        d["hardware"] = {"device": "cpu-" + "x" * 60_000}
        big_spec = Spec.from_dict(d).to_cbor()
        w = self.walk
        # The attacker's own run id, so the protocol refuses the registration for its spec's size.
        nonce = digest("pot/test/soak-nonce/v1", "oversized-spec")[:16]
        registration = encode_call(StartTrainingCommitment(
            derive_run_id(self.attacker.account, nonce), nonce, w.states[0].digest(), w.schedule.commitment,
            w.dataset.dataset_hash, big_spec, w.spec.steps, self.net.endpoint))
        rng = random.Random(13)
        return [*stranger_records(),
                hostile.call_with("submit_checkpoint_root", "size", hostile.bignum()),
                hostile.call_with("submit_checkpoint_root", "proof", hostile.value_sharing()),
                hostile.call_with("submit_checkpoint_root", "proof", hostile.deep_nesting()),
                registration,
                b"pot1" + bytes(rng.getrandbits(8) for _ in range(512)),
                bytes(rng.getrandbits(8) for _ in range(256))]

    def remark(self, payload: bytes) -> None:
        self.attacker.submit_payloads([payload], wait=False)
        self.remarks += 1
        # A pot1 payload that is no call leaves one ignored record; a call the protocol refuses, a
        # refusal; foreign bytes nothing at all.
        if payload.startswith(b"pot1"):
            call = payload.startswith((b"pot1\x82\x78\x19start_training", b"pot1\x82\x71configure_network"))
            self.expected["refused" if call else "ignored"] += 1

    def close(self) -> None:
        self.stop.set()
        self.prover.close()
        self.internal.close()


def test_soak_hostile_remarks_and_provers_beside_honest_runs(tmp_path):
    no_dns = dns.unavailable(tmp_path)
    if no_dns is not None:
        log.warning("soak without its DNS staller: %s", no_dns)
    nameserver = None if no_dns is not None else dns.SilentNameServer(tmp_path)
    net = Network(tmp_path, PARAMS, interval=INTERVAL_S)
    soak = Soak(net, tmp_path, stall_dns=nameserver is not None)
    name = "v1"
    figures: dict = {}
    try:
        # The node's account bonds before any run: a challenge's committee is drawn from the bonds on
        # chain when it is issued (on a dev chain any process may sign as the node's account).
        DevTransport(net.chain_path, name).submit([BondVerifier(amount=20_000)])  # 200 seat units: seats never run short
        cfg = net.node_config(name)
        proc = net.start_node(name, cfg, wrap=None if nameserver is None else nameserver.wrap())
        data_dir = tmp_path / f"{name}-data"
        db = data_dir / "node.db"
        responder = threading.Thread(target=soak.respond, daemon=True)
        responder.start()
        deadline = time.monotonic() + 120
        while node_cursor(db) is None:
            assert proc.poll() is None, net.log(name)[-3000:]
            assert time.monotonic() < deadline, "the node never wrote its cursor"
            time.sleep(0.5)
        bonds = ChainView(DevTransport(net.chain_path, "observer"), PARAMS)
        bonds.sync()
        assert bonds.state.vbonds.get(name, 0) >= PARAMS.verifier_stake, bonds.state.vbonds

        payloads = soak.remark_payloads()
        observer = DevTransport(net.chain_path, "observer")
        samples: list[dict] = []
        started = time.monotonic()
        next_honest = next_hostile = next_remark = started
        kinds = iter(soak.kinds() * 100)
        stuck_since = None
        stopped_early = None
        while True:
            now = time.monotonic()
            t = now - started
            soaking = t < SOAK_S
            if soaking and now >= next_honest and t < SOAK_S - 20:
                soak.start_honest()
                next_honest += HONEST_EVERY_S
            if soaking and now >= next_hostile:
                soak.start_hostile(next(kinds))
                next_hostile += HOSTILE_RUN_EVERY_S
            if soaking and now >= next_remark:
                soak.remark(payloads[soak.remarks % len(payloads)])
                next_remark += REMARK_EVERY_S
            head = observer.finalized_head()
            cursor = node_cursor(db)
            lag = head - (cursor if cursor is not None else 0)
            samples.append({"t": round(t, 1), "head": head, "cursor": cursor, "lag": lag,
                            "rss": rss_bytes(proc.pid), "disk": du_bytes(data_dir),
                            "openings": du_bytes(data_dir / "openings")})
            if proc.poll() is not None:
                stopped_early = f"the node exited with {proc.returncode}"
                break
            if soak.errors:
                stopped_early = soak.errors[0]
                break
            stuck_since = (stuck_since or now) if lag > MAX_LAG_BLOCKS else None
            if stuck_since is not None and now - stuck_since > STUCK_S:
                stopped_early = f"the cursor stayed over {MAX_LAG_BLOCKS} blocks behind for {STUCK_S:g} s"
                break
            if not soaking:
                if (all(cid is not None and cid in soak.verdicts for cid in soak.honest.values())
                        and lag <= FINAL_LAG_BLOCKS) or t > SOAK_S + DRAIN_S:
                    break
            time.sleep(1.0)

        verdicts = {run: soak.verdicts.get(cid) for run, cid in soak.honest.items() if cid is not None}
        # The last remarks sealed, and the node past them, before its records are counted.
        time.sleep(2 * INTERVAL_S)
        end_head, waited = observer.finalized_head(), time.monotonic() + 15
        while (node_cursor(db) or 0) < end_head and time.monotonic() < waited:
            time.sleep(0.5)
        events = node_event_counts(db)
        final = ChainView(DevTransport(net.chain_path, "observer"), PARAMS)
        final.sync()
        third = max(1, len(samples) // 3)
        mib = 2 ** 20
        figures = {
            "soak_s": round(samples[-1]["t"], 1), "stopped_early": stopped_early,
            "blocks": samples[-1]["head"], "hostile_remarks": soak.remarks,
            "honest_runs": len(soak.honest), "honest_challenged": sum(c is not None for c in soak.honest.values()),
            "honest_resolved_honest": sum(v == "honest" for v in verdicts.values()),
            "honest_verdicts": sorted({str(v) for v in verdicts.values()}),
            "hostile_runs": len(soak.hostile), "hostile_challenged": len(soak.hostile_challenges),
            "hostile_resolved": sum(c in soak.verdicts for c in soak.hostile_challenges),
            "hostile_verdicts": sorted({soak.verdicts[c] for c in soak.hostile_challenges if c in soak.verdicts}),
            "internal_requests": soak.internal.requests,
            "remarks_ignored": events.get("RemarkIgnored", 0), "remarks_ignored_expected": soak.expected["ignored"],
            "calls_refused": events.get("CallRefused", 0), "calls_refused_expected": soak.expected["refused"],
            "lag_max_blocks": max(s["lag"] for s in samples),
            "lag_final_blocks": samples[-1]["lag"],
            "rss_first_third_max_mib": round(max(s["rss"] for s in samples[:third]) / mib),
            "rss_last_third_max_mib": round(max(s["rss"] for s in samples[-third:]) / mib),
            "rss_peak_mib": round(max(s["rss"] for s in samples) / mib),
            "disk_peak_mib": round(max(s["disk"] for s in samples) / mib, 1),
            "disk_final_mib": round(samples[-1]["disk"] / mib, 1),
            "openings_peak_mib": round(max(s["openings"] for s in samples) / mib, 1),
            "dns_staller": "skipped: " + no_dns if nameserver is None else "on",
            "dns_queries_unanswered": 0 if nameserver is None else nameserver.queries,
            "authority": final.state.authority, "params_changes_scheduled": len(final.state.schedule),
            "params_unchanged": final.state.params == PARAMS,
        }
        report = "soak figures: " + json.dumps(figures, sort_keys=True)
        print("\n" + report, flush=True)
        log.info(report)
        (tmp_path / "soak-figures.json").write_text(json.dumps({"figures": figures, "samples": samples}, indent=1))

        assert stopped_early is None, f"{stopped_early}\n{report}\n{net.log(name)[-3000:]}"
        assert soak.honest and all(c is not None for c in soak.honest.values()), report
        assert figures["honest_resolved_honest"] == len(soak.honest), f"{verdicts}\n{report}"
        assert figures["lag_max_blocks"] <= MAX_LAG_BLOCKS and figures["lag_final_blocks"] <= FINAL_LAG_BLOCKS, report
        assert figures["rss_peak_mib"] <= MAX_RSS_MIB, report
        assert figures["rss_last_third_max_mib"] <= figures["rss_first_third_max_mib"] + MAX_RSS_GROWTH_MIB, report
        assert figures["disk_peak_mib"] <= MAX_DISK_MIB, report
        assert figures["internal_requests"] == 0, report
        # A stranger's records neither took the network nor waited to change its parameters.
        assert figures["authority"] != soak.attacker.account, report
        assert figures["params_unchanged"] and figures["params_changes_scheduled"] == 0, report
        if nameserver is not None:  # the staller's names were looked up, and stalled, beside the honest runs
            assert figures["dns_queries_unanswered"] > 0, report
        assert figures["remarks_ignored"] == soak.expected["ignored"], report
        assert figures["calls_refused"] >= soak.expected["refused"], report
        assert proc.poll() is None, net.log(name)[-3000:]
    finally:
        soak.close()
        net.close()
        if nameserver is not None:
            nameserver.close()

