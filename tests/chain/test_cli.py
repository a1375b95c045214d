"""`pot chain dev` and `pot chain events`, through the real `pot` app."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from chain.calls import UnbondVerifier
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from pot.cli import app
from tests.chain.runs import SyntheticRun, bond, witness

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def pot(*args):
    return runner.invoke(app, ["chain", *args])


def chain_with_events(path):
    run = SyntheticRun()
    miner = DevTransport(path, "miner")
    if miner.protocol_params() is None:
        miner.record_params(ProtocolParams())
    miner.submit([run.register()])
    miner.submit([run.submit_root(4)])
    miner.submit([run.submit_root(2)])  # refused
    return run


def test_dev_creates_and_inspects(tmp_path):
    db = tmp_path / "c.db"
    params = tmp_path / "params.toml"
    params.write_text('[protocol]\ncommit_window = 7\nquorum_share = "2/3"\n')
    r = pot("dev", "--db", str(db), "--params", str(params))
    assert r.exit_code == 0, r.output
    assert "instant sealing, head 0" in r.output
    chain_with_events(db)
    r = pot("dev", "--db", str(db), "--inspect", "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["head"] == 3 and info["hashes_ok"] and info["sealing"] == "instant"
    assert info["params"]["commit_window"] == 7 and info["params"]["quorum_share"] == [2, 3]
    assert info["network"]["params"] == info["params"] and info["network"]["source"] == "the dev chain file"
    assert [b["number"] for b in info["recent_blocks"]] == [0, 1, 2, 3]
    r = pot("dev", "--db", str(db), "--inspect")
    assert r.exit_code == 0 and "hashes: ok" in r.output and "block      3" in r.output


def test_dev_refusals(tmp_path):
    r = pot("dev", "--db", str(tmp_path / "missing.db"), "--inspect")
    assert r.exit_code == 2 and "no such dev chain file" in r.output
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"x" * 4096)
    r = pot("dev", "--db", str(junk))
    assert r.exit_code == 2 and "not a usable dev chain file" in r.output
    bad = tmp_path / "bad.toml"
    bad.write_text("comit_window = 3\n")
    r = pot("dev", "--db", str(tmp_path / "c.db"), "--params", str(bad))
    assert r.exit_code == 2 and "unknown protocol parameter(s) comit_window" in r.output
    r = pot("dev", "--db", str(tmp_path / "c.db"), "--interval", "0")
    assert r.exit_code == 2 and "positive" in r.output


def test_events_json_lines(tmp_path):
    db = tmp_path / "c.db"
    run = chain_with_events(db)
    r = pot("events", "--chain", f"dev://{db}", "--json")
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert [d["event"] for d in lines] == ["RunRegistered", "CheckpointRootUpdated", "CallRefused"]
    assert lines[0]["run_id"] == run.run_id.hex() and lines[0]["block"] == 1
    assert lines[2]["refusal"] == "RootNotAppendOnly"
    r = pot("events", "--chain", f"dev://{db}", "--json", "--from", "2")
    assert [json.loads(x)["block"] for x in r.output.splitlines()] == [2, 3]
    r = pot("events", "--chain", f"dev://{db}")
    assert r.output.splitlines()[0].startswith("block 1 RunRegistered run_id=")


def test_events_use_recorded_params(tmp_path):
    db = tmp_path / "c.db"
    t = DevTransport(db, "miner")
    t.record_params(ProtocolParams(challenge_delay=1, challenges_per_run=1, forced_challenge_steps=(7,)))
    run = SyntheticRun()
    DevTransport(db, "v1").submit([bond(100)])  # one seat unit: a challenge waits for a seat to sit
    t.submit([run.register()])
    t.submit([run.submit_full_root()])
    t.seal()
    r = pot("events", "--chain", f"dev://{db}", "--json")
    issued = [json.loads(x) for x in r.output.splitlines() if '"ChallengeIssued"' in x]
    assert len(issued) == 1 and issued[0]["step"] == 7 and issued[0]["block"] == 4  # the root's block + 1
    assert issued[0]["committee"] == ["v1"]


def _challenged_chain(db):
    """v1..v3 bond (v3 later unbonds part), a run is challenged, v1 commits; one round of one
    challenge is resolved without quorum and re-challenged."""
    params = ProtocolParams(challenge_delay=1, challenges_per_run=1, opening_deadline=2, commit_window=2,
                            reveal_window=2, quorum_min_reveals=2, forced_challenge_steps=(3,))
    run = SyntheticRun(steps=4)
    t = DevTransport(db, "miner")
    t.record_params(params)
    for v in ("v1", "v2", "v3"):
        DevTransport(db, v).submit([bond(150)])
    t.submit([run.register()])
    t.submit([run.submit_full_root()])
    t.seal()
    (ch,) = [e for e in _events(db) if e["event"] == "ChallengeIssued"]
    cid = bytes.fromhex(ch["challenge_id"])
    t.submit([run.opening(cid, 3)])
    DevTransport(db, "v1").submit([witness(cid, "v1", run.value_hash(3))[0]])
    DevTransport(db, "v3").submit([UnbondVerifier(50)])
    while t.finalized_head() <= ch["escalate_deadline"]:  # a round resolves after its escalation window
        t.seal()
    return run, ch


def _events(db):
    r = pot("events", "--chain", f"dev://{db}", "--json")
    assert r.exit_code == 0, r.output
    return [json.loads(x) for x in r.output.splitlines()]


def test_events_and_inspect_show_bonds_committees_and_rounds(tmp_path):
    db = tmp_path / "c.db"
    run, first = _challenged_chain(db)
    events = _events(db)
    bonded = [e for e in events if e["event"] == "VerifierBonded"]
    assert [(e["verifier"], e["amount"], e["bond"]) for e in bonded] == [("v1", 150, 150), ("v2", 150, 150),
                                                                          ("v3", 150, 150)]
    assert first["committee"] == ["v1", "v2", "v3"] and first["round"] == 1 and first["first"] is None
    (unb,) = [e for e in events if e["event"] == "VerifierUnbonding"]
    assert (unb["verifier"], unb["amount"], unb["bond"]) == ("v3", 50, 100)
    (res,) = [e for e in events if e["event"] == "ChallengeResolved"]
    assert res["verdict"] == "inconclusive" and res["round"] == 1 and res["rechallenge"]
    (again,) = [e for e in events if e["event"] == "ChallengeIssued" and e["round"] == 2]
    assert again["challenge_id"] == res["rechallenge"] and again["first"] == first["challenge_id"]
    pens = sorted((e["verifier"], e["why"]) for e in events if e["event"] == "VerifierPenalized")
    assert pens == [("v1", "no_reveal"), ("v2", "no_commit"), ("v3", "no_commit")]

    # The text form: one line per event, the committee and the round readable.
    r = pot("events", "--chain", f"dev://{db}")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    issued = [x for x in lines if " ChallengeIssued " in x]
    assert "committee=v1,v2,v3" in issued[0] and "round=1" in issued[0] and "first=-" in issued[0]
    assert f"round=2 first={first['challenge_id'][:16]} " in issued[1]
    assert any(" VerifierPenalized " in x and "verifier=v2" in x and "why=no_commit" in x for x in lines)
    assert any(" VerifierBonded " in x and "verifier=v1 amount=150 bond=150" in x for x in lines)

    # --inspect derives the state: the open round, its committee, every verifier's bond.
    r = pot("dev", "--db", str(db), "--inspect", "--json")
    assert r.exit_code == 0, r.output
    proto = json.loads(r.output)["protocol"]
    assert proto["runs"] == 1 and proto["challenges"] == {
        "open": 1,
        "resolved": 1,
        "verdicts": {"inconclusive": 1},
    }
    (open_,) = proto["open_challenges"]
    assert open_["challenge_id"] == again["challenge_id"] and open_["round"] == 2
    assert open_["first"] == first["challenge_id"] and open_["step"] == 3 and not open_["opened"]
    assert sorted(open_["committee"]) == sorted(again["committee"])
    by = {v["account"]: v for v in proto["verifiers"]}
    assert by["v3"]["unbonding"] == [[unb["release_block"], 50]]
    assert by["v2"]["penalized"] == 50 and by["v2"]["bond"] == 100 and by["v2"]["eligible"]
    assert by["v3"]["bond"] == 50 and not by["v3"]["eligible"]
    r = pot("dev", "--db", str(db), "--inspect")
    assert r.exit_code == 0, r.output
    assert "protocol: 1 run(s), 1 open challenge(s), 1 resolved (1 inconclusive)" in r.output
    assert f"challenge {again['challenge_id'][:16]} run {run.run_id.hex()[:16]} step 3 round 2" in r.output
    assert "verifier v3: bond 50 (not eligible), unbonding 50 until block" in r.output


def test_events_refusals(tmp_path):
    r = pot("events", "--chain", "http://example:80")
    assert r.exit_code == 2 and "unsupported chain URL" in r.output
    r = pot("events", "--chain", f"dev://{tmp_path}/c.db", "--from", "-1")
    assert r.exit_code == 2
    r = pot("events", "--chain", f"dev://{tmp_path}/c.db", "--follow", "--poll", "0")
    assert r.exit_code == 2 and "--poll must be a positive number" in r.output


def _spawn(*args):
    return subprocess.Popen([sys.executable, "-m", "pot", "chain", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_interval_sealer_and_follow_processes(tmp_path):
    db = tmp_path / "c.db"
    params = tmp_path / "params.toml"
    params.write_text("[protocol]\n")
    sealer = _spawn("dev", "--db", str(db), "--interval", "0.1", "--params", str(params))
    follower = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not db.exists() or DevTransport(db).finalized_head() < 3):
            time.sleep(0.1)
        miner = DevTransport(db, "miner")
        assert miner.chain.sealing == "interval" and miner.finalized_head() >= 3
        follower = _spawn("events", "--chain", f"dev://{db}", "--json", "--follow", "--poll", "0.1")
        run = SyntheticRun()
        receipt = miner.submit([run.register()], timeout=20)
        line = json.loads(follower.stdout.readline())
        assert line["event"] == "RunRegistered" and line["block"] == receipt.block_number
    finally:
        for p in (follower, sealer):
            if p is not None:
                p.send_signal(signal.SIGINT)
        for p in (follower, sealer):
            if p is not None:
                try:
                    # a clean exit on SIGINT; the room is for a machine loaded by a parallel suite
                    p.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    try:
        assert sealer.returncode == 0, sealer.stderr.read()
        assert follower.returncode == 0, follower.stderr.read()
    finally:
        for p in (follower, sealer):
            p.stdout.close()
            p.stderr.close()
    assert DevTransport(db).chain.verify() == []
