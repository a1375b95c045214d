"""A whole network as separate processes: `pot chain dev` sealing a dev chain, one `pot miner train`,
and verifier nodes (`pot node run`), each with its own database and account, each bonding on start
(`[verifier] bond`) before the miner trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from chain.view import ChainView
from devnet.procs import free_port
from devnet.toml import to_toml

REPO = Path(__file__).resolve().parents[2]

TINY_GPT = """\
version = "pot/spec/v1"
profile = "exact-v1"
dtype = "float32"
loss = "cross-entropy"
steps = {steps}

[model]
kind = "gpt"
vocab_size = 256
block_size = 16
n_layer = 1
n_head = 2
n_embd = 32

[batch]
batch_size = 4
seq_len = 16

[rng]
seed = 7
schedule_seed = 11
"""


# What each node bonds on start: enough to stay eligible through the tests' outlier penalties.
BOND = 1000


def protocol_toml(p: ProtocolParams) -> str:
    """The [protocol] table of every parameter (the chain's --params, the miner's pin, each node's)."""
    return to_toml({"protocol": p.to_dict()})


class Cluster:
    """The chain is a `pot chain dev` process, or (with `chopsticks`) a real Substrate runtime driven
    through the remark transport, with a block made every `interval` seconds."""

    def __init__(self, tmp: Path, params: ProtocolParams, *, interval: float = 0.5, chopsticks=None) -> None:
        self.tmp = tmp
        self.params = params
        self.procs: dict[str, subprocess.Popen] = {}
        self.params_file = tmp / "params.toml"
        self.params_file.write_text(protocol_toml(params))
        self.chopsticks = chopsticks
        self.kind = "dev" if chopsticks is None else "chopsticks"
        self.keys: dict[str, str] = {}  # Substrate: participant -> key URI
        self.accounts: dict[str, str] = {}  # participant -> the origin its calls carry
        self.start_block = 0
        self._stop = threading.Event()
        self._maker: threading.Thread | None = None
        if chopsticks is None:
            self.chain_db = tmp / "chain.db"
            self.url = f"dev:///{self.chain_db}"
            self.spawn("chain", "chain", "dev", "--db", str(self.chain_db), "--interval", str(interval),
                       "--params", str(self.params_file))
            deadline = time.monotonic() + 60
            while not self.chain_db.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            from chain.connect import connect
            from tests.chain.chopsticks_env import fresh_chain

            self.url = chopsticks.url
            self.start_block = fresh_chain(chopsticks)
            observer = connect(self.url, key="//pot//observer")
            self.ss58_format = observer.client.ss58_format  # origins are addresses in the chain's format
            observer.close()
            self._maker = threading.Thread(target=self._make_blocks, args=(interval,), daemon=True)
            self._maker.start()

    def _make_blocks(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.chopsticks.new_blocks(1)
            except Exception:  # a slow block is retried at the next tick
                continue

    def account(self, name: str) -> str:
        """The origin of `name`'s calls: its dev account name, or its funded Substrate address."""
        if self.chopsticks is None:
            return name
        if name not in self.accounts:
            from chain.keys import load_key
            from tests.chain.chopsticks_env import unique_key

            self.keys[name] = unique_key(name)
            self.accounts[name] = load_key(self.keys[name], ss58_format=self.ss58_format).ss58_address
            self.chopsticks.fund([self.accounts[name]])
        return self.accounts[name]

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        # stdout (what a command prints) and stderr (JSON logs, progress) go to separate files.
        with open(self.tmp / f"{name}.log", "ab") as out, open(self.tmp / f"{name}.err", "ab") as err:
            proc = subprocess.Popen([sys.executable, "-m", "pot", *args], cwd=REPO, stdout=out, stderr=err,
                                    env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def err(self, name: str) -> str:
        return (self.tmp / f"{name}.err").read_text(errors="replace")

    def start_verifier(self, name: str, *, fault: str = "none", bond: int = BOND,
                       fetch: dict[str, float] | None = None, escalate: bool | None = None) -> Path:
        """A `pot node run` process; `fetch` overrides [fetch] settings (timeouts, attempts).
        `escalate` defaults to honest nodes only: a faulty node stands for a broken or lazy one,
        whose dissent would take every step it disputes through a dispute round."""
        escalate = fault == "none" if escalate is None else escalate
        cfg = self.tmp / f"{name}.toml"
        self.account(name)
        secrets = ""
        if self.chopsticks is not None:
            path = self.tmp / f"{name}-secrets.toml"
            path.write_text(f'[key]\nuri = "{self.keys[name]}"\n')
            path.chmod(0o600)
            secrets = f'secrets_file = "{path}"'
        cfg.write_text("\n".join([
            "[node]", f'data_dir = "{name}-data"', "loop_interval_s = 0.1", secrets,
            "[chain]", f'url = "{self.url}"', f'account = "{name}"', "poll_s = 0.2",
            # a Substrate node pins the network's authority (this cluster's network records none)
            f'authority = "{self.account("authority")}"' if self.chopsticks is not None else "",
            f"start_block = {self.start_block}", "watchdog_s = 120.0", "resend_after_blocks = 6",
            "[fetch]", 'allow = ["127.0.0.1"]',
            *[f"{k} = {v}" for k, v in {"attempts": 4, "backoff_base_s": 0.2, "backoff_max_s": 2.0,
                                         **(fetch or {})}.items()],
            "[http]", f'listen = "127.0.0.1:{free_port()}"',  # each node serves its API on its own port
            "[verifier]", f"bond = {bond}",  # bonded on start: committees are drawn from bonds on chain
            f"escalate = {str(escalate).lower()}",
        ]) + "\n" + protocol_toml(self.params))
        # A faulty node is the real daemon with devnet's fault hooks (a node's config holds no fault).
        command = ("node", "run") if fault == "none" else ("devnet", "node", "--fault", fault)
        self.spawn(name, *command, "--config", str(cfg), "--init")
        return cfg

    def wait_bonded(self, names: list[str], timeout: float = 180.0) -> dict[str, int]:
        """Until the chain shows every named verifier with an active bond of at least verifier_stake
        (so the miner's challenges seat them); their bonds then."""
        deadline = time.monotonic() + timeout
        while True:
            bonds = self.view().state.vbonds
            missing = [n for n in names if bonds.get(self.account(n), 0) < self.params.verifier_stake]
            if not missing:
                return {n: bonds[self.account(n)] for n in names}
            for n in missing:
                proc = self.procs.get(n)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{n} exited with {proc.returncode} before bonding:\n{self.err(n)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"verifiers {missing} did not bond within {timeout:.0f} s")
            time.sleep(1.0)

    def node_db(self, name: str) -> sa.Engine:
        from node.db import open_database

        return open_database(f"sqlite:///{self.tmp / f'{name}-data' / 'node.db'}")

    def train(self, spec: Path, data: Path, *, steps_timeout: float, substitute_at: int | None = None,
              port: int | None = None, endpoint: str | None = None, miner: str = "miner") -> tuple[int, dict]:
        """Run the miner to the end (it follows its challenges until they resolve). `port` is its
        prover's; `endpoint` the address it announces instead (a proxy in front of it). `miner`
        names the process and its account: another name is another miner, with its own output
        directory (`<miner>-run`), so several runs can follow one another on one chain."""
        out_dir = self.tmp / ("run" if miner == "miner" else f"{miner}-run")
        args = ["miner", "train", "--spec", str(spec), "--data", str(data), "--out", str(out_dir),
                "--chain", self.url, "--port", str(port or free_port()), "--json", "--timeout",
                str(int(steps_timeout)), "--params", str(self.params_file)]
        if endpoint is not None:
            args += ["--endpoint", endpoint]
        self.account(miner)
        args += ["--account", miner] if self.chopsticks is None else ["--key", self.keys[miner]]
        if substitute_at is not None:
            args += ["--substitute-batch-at", str(substitute_at)]
        proc = self.spawn(miner, *args)
        rc = proc.wait(steps_timeout + 120)
        out = self.log(miner).strip().splitlines()
        summary = json.loads(out[-1]) if out and out[-1].startswith("{") else {}
        return rc, summary

    def view(self) -> ChainView:
        if self.chopsticks is None:
            transport = DevTransport(self.chain_db, "observer")
        else:
            from chain.connect import connect

            transport = connect(self.url, key="//pot//observer")
        try:
            v = ChainView(transport, self.params, cursor=self.start_block)
            v.sync()
        finally:
            transport.close()
        return v

    def wait_ingested(self, names: list[str], challenge_id: bytes, timeout: float = 60) -> None:
        """Until every node has recorded the challenge's verdict."""
        from node.db import challenges

        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                eng = self.node_db(name)
                with eng.connect() as c:
                    v = c.execute(sa.select(challenges.c.verdict).where(
                        challenges.c.challenge_id == challenge_id)).scalar()
                eng.dispose()
                if v is not None:
                    pending.discard(name)
            time.sleep(0.5)
        if pending:
            raise TimeoutError(f"nodes {sorted(pending)} did not record the verdict")

    def close(self) -> None:
        self._stop.set()
        if self._maker is not None:
            self._maker.join(60)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
