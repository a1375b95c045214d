"""`pot demo`: a whole network on one machine. Four verifier nodes bond on chain; then a miner trains
a small GPT twice (honestly, and once on a substituted batch) and the verifiers, each holding seats
on every challenge's committee, witness the challenged steps: two honestly, one revealing noise and
one LAZY (it commits the public H(leaf t) with a made-up proof hash, never fetching or replaying).
The demo prints progress, serves one node's dashboard and ends with a summary of verdicts, of the
verifiers outside the winning cluster and penalised, of the fees paid to the winning seats, and of
every verifier's bond before and after.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from scalecodec.utils.ss58 import ss58_encode
from substrateinterface import Keypair

from chain import protocol as P
from chain.calls import ConfigureNetwork
from chain.connect import connect
from chain.dev import DevTransport
from chain.network import read_network
from chain.protocol import ProtocolParams
from chain.protocol.events import (
    ChallengeEscalated,
    EscalationSettled,
    VerifierBonded,
    VerifierPaid,
    VerifierPenalized,
)
from chain.transport import TransportError
from chain.view import ChainView
from commitments.dataset import prepare_default_corpus
from commitments.files import PRIVATE, atomic_write_text
from commitments.retry import Backoff
from commitments.spec import Spec
from devnet.blocks import FAST_S, SLOW_S, BlockMaker
from devnet.procs import Child, Children, free_port
from devnet.render import short
from devnet.toml import to_toml
from node.api import ApiServer, bind, create_app
from node.config import load_config
from node.db import DatabaseError, chain_cursor, make_engine, open_database

# The model: a one-layer GPT small enough that ten exact-v1 steps, two runs and a dozen replays
# fit in a few minutes on two shared cores, yet a real transformer on the real corpus.
SPEC = {
    "version": "pot/spec/v1", "profile": "exact-v1", "dtype": "float32", "loss": "cross-entropy", "steps": 10,
    "model": {"kind": "gpt", "vocab_size": 256, "block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32,
              "dropout": 0.1, "bias": True, "tie_weights": True, "gelu": "tanh", "init_std": 0.02},
    "optimizer": {"kind": "adamw", "lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
                  "grad_clip": 1.0},
    "batch": {"batch_size": 4, "seq_len": 32},
    "rng": {"seed": 1337, "schedule_seed": 1337, "policy": "philox-v1"},
    "exact": {"matmul": "single"},
}

# (node name, its [node] fault): two honest verifiers, one revealing noise, one lazy.
VERIFIERS = (("v1", "none"), ("v2", "none"), ("v3", "noise"), ("v4", "lazy"))
FAULTS = {"none": "honest", "noise": "FAULTY: reveals noise",
          "lazy": "LAZY: commits the public H(leaf t) with a made-up proof, never replays"}
DEV_MINERS = ("miner-a", "miner-b")
# Substrate dev keys: the two runs' miners, then the four verifiers.
SUBSTRATE_KEYS = ("//Alice", "//Bob", "//Charlie", "//Dave", "//Eve", "//Ferdie")
# What each verifier node bonds on start ([verifier] bond): a hundred seat units (verifier_stake
# each), so that a committee drawn from the units seats every verifier, two challenges run at once,
# and a faulty one's outlier penalties are visible and leave it eligible for the demo's challenges.
DEMO_BOND = 10_000
# Seats of a first-round committee per verifier: 160 seats drawn without replacement from the 400
# seat units of four verifiers (each has none with probability below 1e-9), leaving 240 free for
# the other run's challenge at the same time.
SEATS_PER_VERIFIER = 40
BOND_WAIT_S = 120.0
# The chain view's retries when the chain does not answer: jittered, growing to 5 s, 20 at most.
CHAIN_RETRY = Backoff(base_s=0.4, cap_s=5.0)
CHAIN_ATTEMPTS = 20


class DemoError(RuntimeError):
    """The demo cannot go on (a child died, a port is taken, a chain refused), with the reason."""


def demo_params(steps: int, substitute_at: int) -> ProtocolParams:
    """Protocol parameters of the demo: the substituted step is challenged first and one step is
    drawn (two challenges per run, in consecutive blocks). Each verifier_stake of free bond is a
    seat unit (a hundred per verifier) and a committee draws SEATS_PER_VERIFIER x 4 seats without
    replacement from the free units, so every verifier sits on every committee and both runs'
    challenges are open at once. The two honest verifiers hold half the units, so the winning
    cluster needs a third of the seats (their share of a draw stays far above it, and far above
    either faulty verifier's). A penalty is per seat: 10 x about 40 per challenge leaves a faulty
    verifier eligible through all four challenges."""
    return ProtocolParams(commit_window=120, reveal_window=60, opening_deadline=60,
                          challenges_per_run=2, challenge_delay=2, quorum_min_reveals=3,
                          quorum_share=Fraction(1, 3), committee_size=SEATS_PER_VERIFIER * len(VERIFIERS),
                          verifier_stake=100, no_show_penalty=10, outlier_penalty=10,
                          forced_challenge_steps=(substitute_at,))


def node_escalates(fault: str) -> bool:
    """Whether a demo node escalates a round it dissents from ([verifier] escalate): the honest
    ones only. The noisy one's random values are no dissent, and the lazy one's copy of the miner's
    H(leaf t) disputes every fraud verdict: either would stake escalation_stake on a dispute round
    it loses, and take the demo through the dispute round's longer windows."""
    return fault == "none"


# --- the network ----------------------------------------------------------------------------------


@dataclass
class RunInfo:
    miner: str
    honest: bool
    substituted_step: int | None
    run_id: bytes | None = None
    registered_at: float | None = None
    complete_at: float | None = None
    size: int = 0
    slashed: int = 0


@dataclass
class ChallengeInfo:
    challenge_id: bytes
    run_id: bytes
    step: int
    index: int
    issued_block: int
    issued_at: float
    opened_at: float | None = None
    resolved_at: float | None = None
    resolved_block: int | None = None
    verdict: str | None = None
    reason: str = ""
    cluster_size: int = 0
    reveals: int = 0
    outliers: tuple[str, ...] = ()
    committed: set[str] = field(default_factory=set)
    revealed: set[str] = field(default_factory=set)
    round: int = 1
    first: bytes | None = None  # the first round's id (None: this is the first round)
    committee: tuple[str, ...] = ()
    rechallenge: bytes | None = None
    penalties: list[tuple[str, int, str]] = field(default_factory=list)  # (account, amount, why)
    payments: list[tuple[str, int, str]] = field(default_factory=list)  # (account, amount, why)
    escalated_by: list[str] = field(default_factory=list)
    forfeited: list[tuple[str, int]] = field(default_factory=list)  # (account, escalation stake lost)


class Demo:
    def __init__(self, workdir: Path, *, chain: str | None, port: int, steps: int, substitute_at: int,
                 timeout: float, say: Any, keep_workdir: bool = True) -> None:
        self.workdir = workdir
        self.keep_workdir = keep_workdir
        self.chain_arg = chain
        self.port = port
        self.steps = steps
        self.substitute_at = substitute_at
        self.timeout = timeout
        self.say = say
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}
        self.children = Children(workdir)
        self.blocks: BlockMaker | None = None
        self.api: Any = None
        self.dashboard_url: str | None = None
        self.params = demo_params(steps, substitute_at)
        self.runs: list[RunInfo] = []
        self.challenges: dict[bytes, ChallengeInfo] = {}
        self.verifier_accounts: dict[str, str] = {}  # chain account -> node name
        self.node_children: list[Child] = []
        self.miner_children: list[Child] = []
        self.node_db_urls: dict[str, str] = {}
        self.view: Any = None
        self.view_transport: Any = None
        self._transports: list[Any] = []  # connections this process opened, closed at the end
        self.start_block = 0
        self.addresses: dict[str, str] = {}  # Substrate key URI -> account address
        self.authority: str | None = None  # Substrate: the account that configures the network
        self.chain_url = ""
        self.bonds_before: dict[str, int] = {}  # verifier account -> active bond once all are bonded

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # --- setup -----------------------------------------------------------------------------------
    def prepare_files(self) -> tuple[Path, Path]:
        t = time.monotonic()
        corpus = self.workdir / "corpus.npy"
        if not corpus.exists():
            self.say("building the default corpus (Python standard library sources, byte tokens)")
            info = prepare_default_corpus(corpus)
            self.say(f"  corpus: {getattr(info, 'num_tokens', '?')} tokens")
        spec_path = self.workdir / "spec.toml"
        atomic_write_text(spec_path, to_toml({**SPEC, "steps": self.steps}))
        spec = Spec.from_toml(spec_path)  # refuses a bad spec here, not in four child processes
        self.say(f"model: GPT {spec.model.n_layer} layer, d={spec.model.n_embd}, {self.steps} steps of "
                 f"{spec.batch.batch_size}x{spec.batch.seq_len} tokens, profile {spec.profile}")
        params_path = self.workdir / "params.toml"
        atomic_write_text(params_path, to_toml({"protocol": self.params.to_dict()}))
        self.timings["prepare_s"] = time.monotonic() - t
        return corpus, spec_path

    def open_chain(self) -> None:
        if self.chain_arg is None:
            path = self.workdir / "chain.db"
            self.chain_url = f"dev://{path}"
            sealer = DevTransport(path, "demo", sealing="interval")
            self._transports.append(sealer)
            sealer.record_params(self.params)
            self.blocks = BlockMaker(lambda fast: sealer.seal(), "dev chain sealer").start()
            self.view_transport = DevTransport(path, "demo-observer")
            self.say(f"dev chain {self.chain_url}: a block every {SLOW_S:g} s ({FAST_S:g} s while nobody "
                     f"has to act)")
        else:
            self.chain_url = self.chain_arg
            try:
                t = connect(self.chain_arg, key=SUBSTRATE_KEYS[0], kind="remark", rpc_timeout=30.0)
            except (TransportError, ValueError) as exc:
                raise DemoError(f"cannot connect to {self.chain_arg}: {exc}") from None
            self.view_transport = t
            self._substrate_setup(t)
            self._configure_network(t)
        start = self.view_transport.finalized_head()
        self.start_block = start if self.chain_arg is not None else 0
        self.view = ChainView(self.view_transport, self.params, cursor=self.start_block, keep_events=False)

    def _substrate_setup(self, t: Any) -> None:
        """On chopsticks: fund the demo's accounts and make blocks on demand; elsewhere: use the chain."""
        fmt = t.client.ss58_format
        self.addresses = {k: ss58_encode(Keypair.create_from_uri(k).public_key, fmt) for k in SUBSTRATE_KEYS}
        try:
            t.client.rpc("dev_setStorage", [{"System": {"Account": [
                [[a], {"providers": 1, "data": {"free": str(10**18)}}] for a in self.addresses.values()]}}],
                retry=False)
            t.client.rpc("dev_newBlock", [{"count": 1}], retry=False)
        except Exception as exc:  # not chopsticks: accounts must be funded and blocks come by themselves
            self.say(f"{self.chain_arg}: no dev_* RPCs ({type(exc).__name__}); using the chain's own blocks "
                     f"and balances")
            self.blocks = BlockMaker(None, "chain").start()
            return
        self.say(f"{self.chain_arg}: chopsticks; accounts funded, blocks made every {SLOW_S:g} s "
                 f"({FAST_S:g} s while nobody has to act)")
        maker = connect(self.chain_arg, key=SUBSTRATE_KEYS[0], kind="remark", rpc_timeout=30.0)
        self._transports.append(maker)
        # A chopsticks block costs a runtime execution: fast-forward in batches rather than by rate.
        self.blocks = BlockMaker(lambda fast: maker.client.rpc("dev_newBlock", [{"count": 8 if fast else 1}],
                                                               retry=False), "chopsticks blocks").start()

    def _configure_network(self, t: Any) -> None:
        """Make the demo's parameters the chain's (a configure_network record by the demo's first
        key), unless they are in effect already; nodes, miners and `pot chain events` read them."""
        head = t.finalized_head()
        try:
            rec = read_network(t, head)
        except TransportError as exc:
            raise DemoError(f"cannot read the network record of {self.chain_arg}: {exc}") from None
        if rec.state.configured_at is not None and rec.current == self.params and not rec.state.schedule:
            self.say(f"network parameters: in effect already ({rec.source()})")
            self.authority = rec.authority  # the nodes pin it: a Substrate chain names none
            return
        if rec.authority is not None and rec.authority != t.account:
            raise DemoError(f"{self.chain_arg}: the network is configured by {rec.authority}; the demo's key "
                            f"{SUBSTRATE_KEYS[0]} ({t.account}) cannot change its parameters")
        effective = head + 4  # room for the record to land first: a change is never retroactive
        self.authority = t.account
        try:
            receipt = t.submit([ConfigureNetwork(params=self.params.to_cbor(), effective_block=effective)],
                               timeout=60.0)
        except TransportError as exc:
            raise DemoError(f"cannot record the network's parameters: {exc}") from None
        if receipt.block_number is not None and receipt.block_number >= effective:
            raise DemoError(f"the configure_network record landed in block {receipt.block_number}, too late for "
                            f"its effective block {effective}")
        deadline = time.monotonic() + 60.0
        while t.finalized_head() < effective:
            if time.monotonic() > deadline:
                raise DemoError(f"block {effective}, where the demo's parameters take effect, was not finalized "
                                f"within 60 s")
            time.sleep(0.2)
        self.say(f"network parameters: configure_network in block {receipt.block_number} by {short(t.account)}, "
                 f"in effect from block {effective}")

    def node_config(self, name: str, fault: str) -> Path:
        data = self.workdir / "nodes" / name
        data.mkdir(parents=True, exist_ok=True)
        chain: dict[str, Any] = {"url": self.chain_url, "poll_s": 0.2, "watchdog_s": 60.0,
                                 "resend_after_blocks": 30}
        node: dict[str, Any] = {"data_dir": str(data), "log_level": "info", "loop_interval_s": 0.2}
        if self.chain_arg is None:
            chain["account"] = name
        else:
            key = SUBSTRATE_KEYS[2 + [v for v, _ in VERIFIERS].index(name)]
            secrets = data / "secrets.toml"
            atomic_write_text(secrets, to_toml({"key": {"uri": key}}), mode=PRIVATE)
            node["secrets_file"] = str(secrets)
            chain["start_block"] = self.start_block
            chain["authority"] = self.authority
            self.verifier_accounts[self.addresses[key]] = name
        # [verifier] bond: the node bonds on start, before any challenge it is to sit on is drawn.
        doc = {"node": node, "chain": chain, "database": {"url": ""},
               "verifier": {"bond": DEMO_BOND, "escalate": node_escalates(fault)},
               "fetch": {"allow": ["127.0.0.1"], "attempts": 5, "backoff_base_s": 0.3, "backoff_max_s": 3.0},
               "replay": {"workers": 1}, "http": {"listen": f"127.0.0.1:{free_port()}"},
               "protocol": self.params.to_dict()}
        path = self.workdir / "nodes" / f"{name}.toml"
        atomic_write_text(path, to_toml(doc))
        return path

    def start_nodes(self) -> None:
        for name, fault in VERIFIERS:
            path = self.node_config(name, fault)
            cfg = load_config(path, env={})
            try:
                open_database(cfg.database_url, init=True).dispose()  # the dashboard reads it from the start
            except DatabaseError as exc:
                raise DemoError(f"node {name}: {exc}") from None
            self.node_db_urls[name] = cfg.database_url
            if self.chain_arg is None:
                self.verifier_accounts[name] = name
            # A faulty verifier is the real daemon with devnet's fault hooks (devnet/node_faults.py).
            command = ["node", "run"] if fault == "none" else ["devnet", "node", "--fault", fault]
            child = self.children.start(name, [*command, "--config", str(path)])
            self.node_children.append(child)
            self.say(f"verifier {name} started (pid {child.proc.pid}), bonding {DEMO_BOND}"
                     f"{'  ' + FAULTS[fault] if fault != 'none' else ''}")

    def serve_dashboard(self) -> None:
        """The API and dashboard of node v1, served from this process."""
        cfg = load_config(self.workdir / "nodes" / "v1.toml", env={})
        try:
            sock = bind(f"127.0.0.1:{self.port}")
        except OSError as exc:
            raise DemoError(f"{exc} (choose another with --port)") from None
        try:
            app = create_app(self.node_db_urls["v1"], cfg)
        except Exception as exc:  # the API is optional to the protocol run; say why it is missing
            sock.close()
            self.say(f"the dashboard could not start ({type(exc).__name__}: {exc}); the demo goes on without it")
            return
        self.api = ApiServer(app, sock).start()
        host, port = self.api.address
        self.dashboard_url = f"http://{host}:{port}/"
        self.say(f"dashboard of verifier v1: {self.dashboard_url}  (API: {self.dashboard_url}api/v1/status)")

    def wait_bonds(self, timeout: float = BOND_WAIT_S) -> None:
        """Until the chain shows every verifier bonded (active bond at least verifier_stake): a
        committee is drawn from the bonds on chain when its challenge is issued, so no miner
        trains before. Records each verifier's bond at that point."""
        floor = self.params.verifier_stake
        deadline = time.monotonic() + timeout
        while True:
            for ev in self.view.sync():
                self.on_event(ev)
            bonds = self.view.state.vbonds
            missing = [self._name(a) for a in self.verifier_accounts if bonds.get(a, 0) < floor]
            if not missing:
                break
            for c in self.node_children:
                if c.proc.poll() is not None:
                    raise DemoError(f"verifier {c.name} exited with status {c.proc.returncode} before its bond "
                                    f"was on chain:\n{c.tail()}")
            if time.monotonic() > deadline:
                raise DemoError(f"verifier(s) {', '.join(sorted(missing))} had no bond of at least {floor} on chain "
                                f"within {timeout:.0f} s (the node bonds on start from its [verifier] bond); logs "
                                f"are in {self.workdir / 'logs'}")
            time.sleep(0.3)
        self.bonds_before = {a: bonds.get(a, 0) for a in self.verifier_accounts}
        self.say("every verifier is bonded: " + ", ".join(
            f"{self._name(a)} {b}" for a, b in sorted(self.bonds_before.items(), key=lambda x: self._name(x[0]))))

    def start_miners(self, corpus: Path, spec_path: Path) -> None:
        deadline = max(60, int(self.timeout - self.elapsed()))
        for i, honest in enumerate((True, False)):
            port = free_port()
            args = ["miner", "train", "--spec", str(spec_path), "--data", str(corpus),
                    "--out", str(self.workdir / "runs" / ("honest" if honest else "substituted")),
                    "--chain", self.chain_url, "--port", str(port), "--keep-every", "5",
                    "--timeout", str(deadline), "--json"]
            if self.chain_arg is None:
                miner = DEV_MINERS[i]
                args += ["--account", miner]
            else:
                args += ["--key", SUBSTRATE_KEYS[i]]
                miner = self.addresses[SUBSTRATE_KEYS[i]]
            if not honest:
                args += ["--substitute-batch-at", str(self.substitute_at)]
            self.runs.append(RunInfo(miner, honest, None if honest else self.substitute_at))
            child = self.children.start("miner-honest" if honest else "miner-substituted", args)
            self.miner_children.append(child)
            what = "honest run" if honest else f"run with a substituted batch at step {self.substitute_at}"
            self.say(f"miner {short(miner)}: training the {what} (pid {child.proc.pid}, prover on port {port})")

    # --- watching --------------------------------------------------------------------------------
    def _name(self, account: str) -> str:
        return self.verifier_accounts.get(account, short(account))

    def _run_of(self, run_id: bytes) -> RunInfo | None:
        return next((r for r in self.runs if r.run_id == run_id), None)

    def _label(self, run: RunInfo | None) -> str:
        if run is None:
            return "?"
        return "honest" if run.honest else f"substituted@{run.substituted_step}"

    def on_event(self, ev: Any) -> None:
        now = time.monotonic()
        if isinstance(ev, P.RunRegistered):
            run = next((r for r in self.runs if r.miner == ev.miner and r.run_id is None), None)
            if run is not None:
                run.run_id, run.registered_at = ev.run_id, now
                self.say(f"block {ev.block}: run {short(ev.run_id)} ({self._label(run)}) registered, "
                         f"{ev.declared_steps} steps declared")
        elif isinstance(ev, P.CheckpointRootUpdated):
            run = self._run_of(ev.run_id)
            if run is not None:
                run.size = ev.size
                self.say(f"block {ev.block}: run {short(ev.run_id)} ({self._label(run)}) committed steps "
                         f"1..{ev.size - 1} of {self.steps}")
                if ev.complete:
                    run.complete_at = now
        elif isinstance(ev, P.ChallengeIssued):
            self.challenges[ev.challenge_id] = ChallengeInfo(ev.challenge_id, ev.run_id, ev.step, ev.index,
                                                             ev.block, now, round=ev.round, first=ev.first,
                                                             committee=tuple(ev.committee))
            if ev.round > 1:
                why = f" (round {ev.round}: re-challenge of {short(ev.first or b'')})"
            elif ev.step in self.params.forced_challenge_steps:
                why = " (forced by the demo's parameters)"
            else:
                why = " (drawn from block randomness)"
            seats = ", ".join(f"{self._name(a)} x{ev.committee.count(a)}" for a in dict.fromkeys(ev.committee)) or "nobody"
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)} issued: run {short(ev.run_id)} "
                     f"({self._label(self._run_of(ev.run_id))}) step {ev.step}{why}; committee: {seats}")
        elif isinstance(ev, P.OpeningSubmitted):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.opened_at = now
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: the miner opened step {ev.step}")
        elif isinstance(ev, P.WitnessCommitted):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.committed.add(ev.verifier)
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: {self._name(ev.verifier)} committed")
        elif isinstance(ev, P.WitnessRevealed):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.revealed.add(ev.verifier)
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: {self._name(ev.verifier)} revealed "
                     f"{short(ev.value_hash) if isinstance(ev.value_hash, bytes) else ev.value_hash}")
        elif isinstance(ev, P.ChallengeResolved):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.resolved_at, ch.resolved_block = now, ev.block
                ch.verdict, ch.reason = ev.verdict, ev.reason
                ch.cluster_size, ch.reveals, ch.outliers = ev.cluster_size, ev.reveals, tuple(ev.outliers)
                ch.rechallenge = ev.rechallenge
            outl = ", ".join(self._name(v) for v in ev.outliers) or "none"
            more = f"; re-challenged as {short(ev.rechallenge)}" if ev.rechallenge is not None else ""
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)} (step {ev.step}) RESOLVED: "
                     f"{ev.verdict.upper()} (cluster of {ev.cluster_size} seats, {ev.reveals} reveals; outliers: {outl}; "
                     f"{ev.reason}){more}")
        elif isinstance(ev, P.MinerSlashed):
            run = self._run_of(ev.run_id)
            if run is not None:
                run.slashed += ev.amount
            self.say(f"block {ev.block}: miner {short(ev.miner)} slashed {ev.amount}")
        elif isinstance(ev, P.RevealRejected):
            self.say(f"block {ev.block}: reveal of {self._name(ev.verifier)} rejected: {ev.reason}")
        elif isinstance(ev, VerifierBonded):
            if ev.verifier in self.verifier_accounts:
                self.say(f"block {ev.block}: verifier {self._name(ev.verifier)} bonded {ev.amount} (bond {ev.bond})")
        elif isinstance(ev, VerifierPenalized):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.penalties.append((ev.verifier, ev.amount, ev.why))
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: verifier {self._name(ev.verifier)} "
                     f"PENALISED {ev.amount} ({ev.why})")
        elif isinstance(ev, VerifierPaid):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.payments.append((ev.verifier, ev.amount, ev.why))
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: verifier {self._name(ev.verifier)} "
                     f"paid {ev.amount} ({ev.why})")
        elif isinstance(ev, ChallengeEscalated):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None:
                ch.escalated_by.append(ev.verifier)
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: {self._name(ev.verifier)} ESCALATED it "
                     f"to the dispute round, staking {ev.stake}")
        elif isinstance(ev, EscalationSettled):
            ch = self.challenges.get(ev.challenge_id)
            if ch is not None and ev.forfeited:
                ch.forfeited.append((ev.verifier, ev.forfeited))
            self.say(f"block {ev.block}: challenge {short(ev.challenge_id)}: the escalation of "
                     f"{self._name(ev.verifier)} settled: {ev.returned} returned, {ev.forfeited} forfeited")

    def someone_must_act(self) -> bool:
        """True while a miner or a verifier still has to put something on chain in an open window
        (a verifier: only for the challenges whose committee seats it)."""
        st = self.view.state
        n = st.head
        accounts = set(self.verifier_accounts)
        if not st.challenges and not any(r.challenges_at is not None for r in st.runs.values()):
            return True  # bonding and training: blocks at the slow pace carry the bonds and roots
        for ch in st.challenges.values():
            if ch.verdict is not None:
                continue
            seated = accounts & set(ch.committee)
            if ch.opening is None and n < ch.opening_deadline:
                return True
            if n <= ch.commit_deadline and not seated <= set(ch.commitments):
                return True
            if ch.commit_deadline < n <= ch.reveal_deadline and not seated <= set(ch.reveals):
                return True
        return False

    def done(self) -> bool:
        """Every run complete, all its challenges drawn and every round of each resolved (a
        re-challenge is a new round to wait for), as the chain's state says."""
        if any(r.run_id is None or r.complete_at is None for r in self.runs):
            return False
        st = self.view.state
        for r in self.runs:
            run = st.runs.get(r.run_id)
            if run is None or run.challenges_at is None:
                return False
            if run.drawn < min(st.params.challenges_per_run, run.size - 1):
                return False
            if not all(st.challenges[c].verdict is not None for c in run.challenges):
                return False
        return True

    def watch(self) -> None:
        failures = 0
        while True:
            if self.elapsed() > self.timeout:
                raise DemoError(f"the demo did not finish within {self.timeout:.0f} s (--timeout); logs are in "
                                f"{self.workdir / 'logs'}")
            try:
                for ev in self.view.sync():
                    self.on_event(ev)
                failures = 0
            except TransportError as exc:
                failures += 1
                if failures > CHAIN_ATTEMPTS:
                    raise DemoError(f"the chain stopped answering: {exc}") from None
                time.sleep(CHAIN_RETRY.delay(failures - 1))
                continue
            if self.blocks is not None:
                if self.someone_must_act():
                    self.blocks.fast.clear()
                else:
                    self.blocks.fast.set()
            for c in self.node_children:
                if c.proc.poll() is not None:
                    raise DemoError(f"verifier {c.name} exited with status {c.proc.returncode}:\n{c.tail()}")
            for c in self.miner_children:
                # 1 is the miner's "a challenge of my run came out fraud": expected of the substituted run.
                if c.proc.poll() not in (None, 0, 1):
                    raise DemoError(f"{c.name} exited with status {c.proc.returncode}:\n{c.tail()}")
            if self.done():
                return
            time.sleep(0.2)

    def wait_nodes_caught_up(self, timeout: float = 60.0) -> None:
        """Let every node record the last resolution before it is stopped (the dashboard shows it)."""
        target = max((c.resolved_block or 0) for c in self.challenges.values())
        deadline = time.monotonic() + timeout
        engines = {n: make_engine(u) for n, u in self.node_db_urls.items()}
        try:
            pending = set(engines)
            while pending and time.monotonic() < deadline:
                for name in list(pending):
                    with engines[name].connect() as conn:
                        block = conn.execute(sa.select(chain_cursor.c.block)).scalar()
                    if block is not None and block >= target:
                        pending.discard(name)
                time.sleep(0.3)
            if pending:
                self.say(f"verifier(s) {', '.join(sorted(pending))} did not reach block {target} within "
                         f"{timeout:.0f} s; their dashboards may lag")
        finally:
            for e in engines.values():
                e.dispose()

    def wait_miners(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for c in self.miner_children:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{c.name} still following after the verdicts; stopping it")

    # --- the summary -----------------------------------------------------------------------------
    def _final(self, c: ChallengeInfo) -> ChallengeInfo:
        """The last round of a challenge (following its re-challenges)."""
        while c.rechallenge is not None and c.rechallenge in self.challenges:
            c = self.challenges[c.rechallenge]
        return c

    def summary(self) -> dict[str, Any]:
        runs = []
        for r in self.runs:
            mine = sorted((c for c in self.challenges.values() if c.run_id == r.run_id),
                          key=lambda c: (c.index, c.round))
            runs.append({
                "run_id": r.run_id.hex() if r.run_id else None, "miner": r.miner, "honest": r.honest,
                "substituted_step": r.substituted_step, "steps": self.steps, "slashed": r.slashed,
                "training_seconds": round(r.complete_at - r.registered_at, 2)
                if r.complete_at and r.registered_at else None,
                # Every round's verdict; "final" is each challenge's last round, once per challenge.
                "verdicts": [{"challenge_id": c.challenge_id.hex(), "step": c.step, "verdict": c.verdict,
                              "round": c.round} for c in mine],
                "final": [{"challenge_id": c.challenge_id.hex(), "step": c.step, "verdict": self._final(c).verdict,
                           "rounds": self._final(c).round} for c in mine if c.round == 1]})
        challenges = []
        for c in sorted(self.challenges.values(), key=lambda c: (c.issued_block, c.index, c.round)):
            challenges.append({
                "id": c.challenge_id.hex(), "run_id": c.run_id.hex(), "step": c.step, "round": c.round,
                "first": c.first.hex() if c.first else None,
                "rechallenge": c.rechallenge.hex() if c.rechallenge else None,
                "forced": c.step in self.params.forced_challenge_steps, "verdict": c.verdict, "reason": c.reason,
                "cluster_size": c.cluster_size, "reveals": c.reveals,
                "committee": [self._name(v) for v in dict.fromkeys(c.committee)],
                "seats": {self._name(v): c.committee.count(v) for v in dict.fromkeys(c.committee)},
                "outliers": [self._name(v) for v in c.outliers],
                "penalties": [{"verifier": self._name(v), "amount": a, "why": why} for v, a, why in c.penalties],
                "payments": [{"verifier": self._name(v), "amount": a, "why": why} for v, a, why in c.payments],
                "escalated_by": [self._name(v) for v in c.escalated_by],
                "issued_block": c.issued_block, "resolved_block": c.resolved_block,
                "seconds": round(c.resolved_at - c.issued_at, 2) if c.resolved_at else None})
        bonds = self.view.state.vbonds if self.view is not None else {}
        verifiers = []
        for name, fault in VERIFIERS:
            account = next(a for a, n in self.verifier_accounts.items() if n == name)
            penalties = [{"challenge_id": c.challenge_id.hex(), "amount": a, "why": why}
                         for c in self.challenges.values() for v, a, why in c.penalties if v == account]
            payments = [{"challenge_id": c.challenge_id.hex(), "amount": a, "why": why}
                        for c in self.challenges.values() for v, a, why in c.payments if v == account]
            paid_by_why: dict[str, int] = {}
            for p in payments:
                paid_by_why[p["why"]] = paid_by_why.get(p["why"], 0) + p["amount"]
            verifiers.append({
                "name": name, "account": account, "faulty": fault != "none", "fault": fault,
                "outlier_count": sum(account in c.outliers for c in self.challenges.values()),
                "revealed": sum(account in c.revealed for c in self.challenges.values()),
                "seated": sum(account in c.committee for c in self.challenges.values()),
                "seats": sum(c.committee.count(account) for c in self.challenges.values()),
                "bond_before": self.bonds_before.get(account), "bond_after": bonds.get(account, 0),
                "penalties": penalties, "penalised": sum(p["amount"] for p in penalties),
                "payments": payments, "paid": sum(p["amount"] for p in payments), "paid_by_why": paid_by_why,
                "escalations": sum(account in c.escalated_by for c in self.challenges.values()),
                "forfeited": sum(a for c in self.challenges.values() for v, a in c.forfeited if v == account)})
        honest = [r for r in runs if r["honest"]]
        subst = [r for r in runs if not r["honest"]]
        decided = [c for c in challenges if c["verdict"] in ("honest", "fraud")]
        lazy = [v for v in verifiers if v["fault"] == "lazy"]
        checks = {
            "honest_run_judged_honest": bool(honest) and all(
                v["verdict"] == "honest" for r in honest for v in r["final"]) and all(r["final"] for r in honest),
            "substitution_judged_fraud": bool(subst) and all(
                any(v["step"] == r["substituted_step"] and v["verdict"] == "fraud" for v in r["final"])
                for r in subst),
            "faulty_verifier_outlier": all(v["outlier_count"] > 0 for v in verifiers if v["faulty"]),
            # The lazy verifier's pair (H(leaf t), a made-up proof) never joins the replayers' cluster:
            # it is an outlier of every decided challenge and pays an outlier penalty for each.
            "lazy_verifier_outside_cluster": bool(lazy) and bool(decided) and all(
                v["name"] in c["outliers"] for v in lazy for c in decided),
            "lazy_verifier_penalised": bool(lazy) and all(
                sum(p["why"] == "outlier" for p in v["penalties"]) >= len(decided) > 0
                and v["bond_before"] is not None and v["bond_after"] < v["bond_before"] for v in lazy),
            "honest_verifiers_agree": all(v["outlier_count"] == 0 for v in verifiers if not v["faulty"]),
            "honest_verifiers_unpenalised": all(v["penalised"] == 0 for v in verifiers if not v["faulty"]),
            # Fees go to the winning seats only: the honest verifiers are paid, the outliers never.
            "honest_verifiers_paid": all(v["paid"] > 0 for v in verifiers if not v["faulty"]),
            "faulty_verifiers_unpaid": all(v["paid"] == 0 for v in verifiers if v["faulty"]),
            # Every unit a bond gained or lost is a fee, a penalty or a forfeited escalation stake.
            "bonds_add_up": all(v["bond_before"] is not None
                                and v["bond_after"] == v["bond_before"] + v["paid"] - v["penalised"] - v["forfeited"]
                                for v in verifiers),
        }
        return {"runs": runs, "challenges": challenges, "verifiers": verifiers,
                "seconds": round(self.elapsed(), 2), "timings": {k: round(v, 2) for k, v in self.timings.items()},
                "chain": self.chain_url, "params": self.params.to_dict(), "dashboard": self.dashboard_url,
                "workdir": str(self.workdir), "workdir_kept": self.keep_workdir, "checks": checks, "ok": all(checks.values())}

    def say_bonds(self, summary: dict[str, Any]) -> None:
        """Each verifier's bond before the runs and after the verdicts, with the fees paid to it and
        what it was penalised."""
        self.say("verifier bonds (before the runs -> after the verdicts):")
        for v in summary["verifiers"]:
            why: dict[str, int] = {}
            for p in v["penalties"]:
                why[p["why"]] = why.get(p["why"], 0) + p["amount"]
            taken = ", ".join(f"{k} {n}" for k, n in sorted(why.items())) or "no penalty"
            paid = ", ".join(f"{k} {n}" for k, n in sorted(v["paid_by_why"].items())) or "no fee"
            self.say(f"  {v['name']:<3} {FAULTS[v['fault']]:<72} {v['bond_before']} -> {v['bond_after']} "
                     f"(paid: {paid}; penalised: {taken}; outlier in {v['outlier_count']} of {v['seated']} "
                     f"challenge(s))")

    # --- the whole thing -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        corpus, spec_path = self.prepare_files()
        self.open_chain()
        t = time.monotonic()
        self.start_nodes()
        self.serve_dashboard()
        self.wait_bonds()
        self.timings["bonding_s"] = time.monotonic() - t
        self.start_miners(corpus, spec_path)
        self.watch()
        self.timings["protocol_s"] = time.monotonic() - t
        self.wait_miners()
        self.wait_nodes_caught_up()
        self.children.stop()
        summary = self.summary()
        self.say_bonds(summary)
        return summary

    def close(self) -> None:
        self.children.stop()
        if self.blocks is not None:
            self.blocks.stop()
        if self.api is not None:
            self.api.stop()
            self.api = None
        for t in [*self._transports, self.view_transport]:
            if t is not None:
                try:
                    t.close()
                except Exception:  # a connection that already broke is closed either way
                    pass
        self._transports.clear()
        self.view_transport = None

