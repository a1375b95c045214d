"""`pot miner train` as a process on a dev chain: it registers, trains, serves and opens the challenge,
and opens its re-challenge round again under the new id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from chain.view import ChainView
from challenges.opening import load_opening
from challenges.replay import verify_opening_file
from devnet.procs import free_port
from miner.cli import miner_app
from tests.miner.helpers import bond_verifiers, corpus
from tests.miner.test_recipe import spec_toml

ROOT = Path(__file__).resolve().parents[2]
# One challenge; two verifiers bond (a challenge waits for seats) and nobody witnesses it, so round 1
# is inconclusive and re-challenged, and round 2 (the dispute round with max_rounds=2) is left
# unresolved.
PARAMS = ProtocolParams(commit_window=3, reveal_window=3, opening_deadline=6, challenge_delay=1,
                        challenges_per_run=1, max_rounds=2, quorum_min_reveals=2, forced_challenge_steps=(2,))
MIRROR = "http://mirror.example:8761"


def test_miner_train_process(tmp_path):
    data = corpus(tmp_path)
    spec = spec_toml(tmp_path / "spec.toml", steps=3)
    db = tmp_path / "chain.db"
    sealer = DevTransport(db, "sealer", sealing="instant")
    sealer.record_params(PARAMS)
    bond_verifiers(db, ("v1", "v2"))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "pot",
        "miner",
        "train",
        "--spec",
        str(spec),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "run"),
        "--chain",
        f"dev://{db}",
        "--account",
        "miner",
        "--port",
        str(port),
        "--keep-every",
        "2",
        "--timeout",
        "240",
        "--json",
        "--mirror",
        MIRROR,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fetched = None
    opened = []
    try:
        deadline = time.monotonic() + 240
        view = ChainView(sealer, PARAMS)
        # A challenge the miner has not opened yet holds the sealing (for at most 60 s): the opening
        # deadline counts blocks, and a loaded machine must not turn the test's clock into a miss.
        awaiting: dict[bytes, float] = {}
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.4)
            held = any(time.monotonic() - t < 60 for t in awaiting.values())
            if view.state.runs and (next(iter(view.state.runs.values())).size == 4) and not held:
                sealer.seal()  # the run is complete: make blocks so windows pass
            for ev in view.sync():
                if type(ev).__name__ == "ChallengeIssued":
                    awaiting[ev.challenge_id] = time.monotonic()
                if type(ev).__name__ == "OpeningSubmitted":
                    awaiting.pop(ev.challenge_id, None)
                    opened.append(ev)
                if type(ev).__name__ == "OpeningSubmitted" and fetched is None:
                    r = httpx.get(ev.uri, timeout=10)
                    assert r.status_code == 200
                    fetched = r.content
                    assert load_opening(fetched).digest == ev.opening_digest
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["size"] == 4 and len(summary["openings"]) == 2  # round 1 and its re-challenge
    assert list(summary["verdicts"].values()) == ["inconclusive", "inconclusive"]  # nobody witnessed it
    assert list(summary["final"].values()) == ["inconclusive"] and sorted(summary["rounds"].values()) == [
        1,
        2,
    ]
    assert len(set(summary["openings"].values())) == 1  # the same file for both rounds
    assert [e.challenge_id.hex() for e in opened] == list(summary["openings"])
    d = opened[0].opening_digest.hex()
    assert all(e.mirrors == (f"{MIRROR}/openings/{d}",) for e in opened) and summary["mirrors"] == [MIRROR]
    from chain.calls import derive_run_id

    assert bytes.fromhex(summary["run_id"]) == derive_run_id("miner", bytes.fromhex(summary["nonce"]))
    assert fetched is not None
    path = tmp_path / "fetched.opening"
    path.write_bytes(fetched)
    ok, reason, result = verify_opening_file(path)
    assert ok, reason
    assert result.step == 2


def test_miner_cli_refusals(tmp_path):
    runner = CliRunner()
    r = runner.invoke(miner_app, ["serve", str(tmp_path)])
    assert r.exit_code == 2 and "not a run directory" in r.output
    r = runner.invoke(miner_app, ["train", "--spec", str(tmp_path / "none.toml"), "--data", "x.npy",
                                  "--out", str(tmp_path / "run"), "--chain", "dev:///x.db", "--no-serve"])
    assert r.exit_code == 2 and "cannot read spec" in r.output
    spec = spec_toml(tmp_path / "spec.toml")
    r = runner.invoke(miner_app, ["train", "--spec", str(spec), "--data", str(corpus(tmp_path)),
                                  "--out", str(tmp_path / "run"), "--chain", "http://nowhere", "--no-serve"])
    assert r.exit_code == 2 and "unsupported chain URL" in r.output
    db = tmp_path / "chain.db"
    DevTransport(db, "sealer").record_params(PARAMS)
    r = runner.invoke(miner_app, ["train", "--spec", str(spec), "--data", str(corpus(tmp_path)),
                                  "--out", str(tmp_path / "run"), "--chain", f"dev://{db}", "--no-serve",
                                  "--mirror", "ftp://nowhere"])
    assert r.exit_code == 2 and "a mirror must be a base URL" in r.output


GPT_SPEC = """
steps = 3
[model]
kind = "gpt"
block_size = 16
n_layer = 1
n_head = 2
n_embd = 32
dropout = 0.1
[batch]
batch_size = 3
seq_len = 16
[rng]
seed = 7
schedule_seed = 11
"""


@pytest.mark.slow
def test_miner_train_nproc_commits_what_one_process_commits(tmp_path):
    """--nproc 2 through torchrun (gloo, real processes on localhost, shards of 2 and 1 sequences):
    rank 0 registers and commits leaves equal to a one-process walk's; the other rank keeps nothing."""
    from commitments.spec import Spec
    from miner.checkpoints import CheckpointStore
    from tests.miner.helpers import walk

    data = corpus(tmp_path)
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(GPT_SPEC)
    db = tmp_path / "chain.db"
    DevTransport(db, "sealer", sealing="instant").record_params(PARAMS)
    cmd = [sys.executable, "-m", "pot", "miner", "train", "--spec", str(spec_path), "--data", str(data),
           "--out", str(tmp_path / "run"), "--chain", f"dev://{db}", "--account", "miner", "--no-serve",
           "--no-follow", "--keep-every", "2", "--nproc", "2", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1  # rank 0 alone reports
    summary = json.loads(lines[0])
    one = walk(Spec.from_toml(spec_path), data)
    store = CheckpointStore(tmp_path / "run")
    assert store.leaves == one.leaves
    assert summary["size"] == 4
    view = ChainView(DevTransport(db, "reader"), PARAMS)
    view.sync()
    (run,) = view.state.runs.values()
    from commitments import merkle

    assert run.size == 4 and run.root == merkle.MerkleTree.from_leaves(one.leaves).root()
    assert bytes.fromhex(summary["root"]) == run.root
