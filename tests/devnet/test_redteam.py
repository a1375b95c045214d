"""`pot redteam`: every edit of a fresh run is refused, caught or changes no byte; no honest step is
flagged; an edit that changes bytes and passes makes the command fail."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from devnet import redteam
from devnet.cli import redteam_app
from tests.node.harness import REPO

pytestmark = pytest.mark.slow

KINDS = {
    "a changed spec field",
    "a changed dataset byte",
    "a changed batch index",
    "a changed schedule",
    "one ulp changed in one weight",
    "a swapped optimizer moment",
    "a changed step counter",
    "changed loss bits",
    "a forged inclusion proof",
    "an opening from another run or another step",
    "a substituted trajectory with its own consistent hashes",
    "a truncated safetensors file",
    "an oversized or zip-bomb payload",
    "a malformed CBOR manifest",
    "an opening with NaNs",
}
HOSTILE_KINDS = {
    "a hostile remark",
    "a hostile registration",
    "a hostile endpoint or prover",
    "a poison manifest",
    "a hostile API request",
    "a miner starving a shared resource",
    "a block or snapshot the follower chokes on",
    "a hostile authority record",
    "an amplification payload",
}
# Where each hostile input must be stopped.
HOSTILE_STAGES = {
    "bignum-remark": "chain",
    "value-sharing-remark": "chain",
    "deep-nesting-remark": "chain",
    "oversized-spec-registration": "chain",
    "ssrf-endpoint": "fetch",
    "redirect-to-internal": "fetch",
    "gzip-bomb-unwritten": "fetch",
    "oversize-opening-for-spec": "fetch",
    "slowloris-prover": "fetch",
    "poison-manifest": "validate",
    "early-disclosure-get": "api",
    "host-header-rebinding": "api",
    "dns-staller-one-miner": "fetch",
    "siit-metadata-address": "fetch",
    "endpoint-spellings-one-owner": "fetch",
    "broad-allow-list-refused": "config",
    "on-block-failure-contained": "chain",
    "tampered-snapshot-rederived": "chain",
    "sealed-refused-looks-replayed": "api",
    "range-5000-digits": "api",
    "hostile-config-file": "api",
    "opening-deadline-out-of-range": "chain",
    "unbonding-delay-out-of-range": "chain",
    "max-rounds-out-of-range": "chain",
    "unpinned-authority-record": "chain",
    "leaf-list-of-empty-arrays": "losschecks",
    "manifest-of-empty-arrays": "fetch",
}


def test_pot_redteam_json_contract(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pot", "redteam", "--json", "--workdir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == {"edits", "honest_flagged"}
    assert result["honest_flagged"] == 0
    edits = {e["name"]: e for e in result["edits"]}
    assert len(edits) == len(result["edits"]) >= 15
    assert {e["outcome"] for e in edits.values()} <= {"refused", "caught", "no-byte-change"}
    hostile = {n: e for n, e in edits.items() if "must" in e}
    assert {e["kind"] for e in edits.values() if "must" not in e} == KINDS
    assert {e["kind"] for e in hostile.values()} == HOSTILE_KINDS
    assert {n: e["stage"] for n, e in hostile.items()} == HOSTILE_STAGES
    assert len(edits) - len(hostile) == 34
    # Where each forgery must be stopped: tampering with a committed run never reaches compute; a
    # forger's own consistent trajectory is stopped by the replay alone.
    for name in (
        "spec-lr-changed",
        "dataset-byte-changed",
        "dataset-byte-changed-rehashed",
        "batch-index-changed",
        "schedule-reseeded",
        "pre-state-weight-one-ulp",
        "pre-state-moments-swapped",
        "pre-state-step-counter",
        "forged-leaf-proof",
        "opening-of-another-step",
        "opening-of-another-run",
        "truncated-safetensors",
        "manifest-length-bomb",
        "malformed-cbor-manifest",
        "pre-state-nan",
        "committed-nan-pre-state",
    ):
        assert edits[name]["outcome"] == "refused", edits[name]
        # A manifest that is malformed or not the run's spec stops the download itself.
        assert edits[name]["stage"] in ("fetch", "validate"), edits[name]
    for name in ("oversized-opening", "gzip-bomb"):
        assert (edits[name]["outcome"], edits[name]["stage"]) == ("refused", "fetch"), edits[name]
        assert edits[name]["reason"].startswith("[unavailable]"), edits[name]
    assert "too_large" in edits["oversized-opening"]["reason"]
    assert "content_encoding" in edits["gzip-bomb"]["reason"]
    for name in (
        "committed-weight-one-ulp",
        "committed-moments-swapped",
        "committed-step-counter",
        "committed-loss-bits",
        "substituted-batch-trajectory",
        "substituted-finished-model",
        "nan-loss-bits",
    ):
        assert (edits[name]["outcome"], edits[name]["stage"]) == ("caught", "replay"), edits[name]
        assert "differs" in edits[name]["reason"]
    assert {n for n, e in edits.items() if e["outcome"] == "no-byte-change"} == {
        "spec-default-restated", "committed-weight-times-one", "manifest-reencoded"}
    # The human table goes to stderr with --json and names every edit.
    for name in edits:
        assert name in proc.stderr


def test_a_byte_changing_edit_that_passes_fails_the_command(tmp_path, monkeypatch):
    # The honest trajectory registered again under a new run id: its bytes differ from the honest
    # opening (the run id), yet every check passes. Declared as a change, it must count as missed.
    def reregistered(lab):
        run_id = lab.register(lab.leaves, tag="reregistered")
        data = lab.forged_opening(run_id, lab.leaves, lab.states[redteam.CHALLENGED - 1])
        return redteam.Attempt(data, run_id, changed=data != lab.opening())

    monkeypatch.setattr(
        redteam, "EDITS", [*redteam.EDITS, ("reregistered-run", "a changed spec field", reregistered)]
    )
    res = CliRunner().invoke(redteam_app, ["--json", "--workdir", str(tmp_path), "--only", "reregistered-run",
                                           "--only", "manifest-reencoded"])
    assert res.exit_code == 1, res.output
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(e["name"], e["outcome"]) for e in result["edits"]] == [
        ("manifest-reencoded", "no-byte-change"), ("reregistered-run", "missed")]
    assert result["honest_flagged"] == 0


def test_every_hostile_input_is_held(tmp_path):
    # The probes alone (no edits): each states what the node must do, and each must hold.
    report = redteam.run_redteam(tmp_path, only=list(HOSTILE_STAGES))
    rows = {e.name: e for e in report.edits}
    assert set(rows) == set(HOSTILE_STAGES) == {p.name for p in redteam.PROBES}
    failed = {n: f"[{e.stage}] {e.reason}" for n, e in rows.items() if e.outcome != "refused"}
    assert not failed, failed
    assert {n: e.stage for n, e in rows.items()} == HOSTILE_STAGES
    assert all(e.must for e in rows.values())
    assert f"hostile inputs: {len(HOSTILE_STAGES)} held, 0 MISSED" in redteam.format_table(report)


def test_unknown_edit_is_refused_by_name(tmp_path):
    res = CliRunner().invoke(redteam_app, ["--only", "no-such-edit", "--workdir", str(tmp_path)])
    assert res.exit_code == 2
    assert "unknown edit(s) no-such-edit" in res.output


def test_an_opening_pre_state_has_one_byte_layout():
    # Found by the red team: two safetensors metadata keys came out in hash order, so one state
    # had two byte layouts and one step two opening digests.
    from challenges.opening import state_bytes
    from commitments.spec import Spec
    from oracle.step import init_state

    state = init_state(Spec.from_dict(redteam.SPEC))
    assert len({state_bytes(state) for _ in range(16)}) == 1


def test_hostile_cbor_is_what_it_claims():
    # The probes' inputs, read by cbor2 itself: a bignum past the digit limit, a value-sharing DAG
    # of 2^60 paths in a few hundred bytes, and a nesting far past any recursion limit.
    import sys

    import cbor2

    from devnet import hostile

    big = cbor2.loads(hostile.bignum())
    assert big.bit_length() > 3.33 * sys.get_int_max_str_digits()
    sharing = hostile.value_sharing(60)
    assert len(sharing) < 700
    small = cbor2.loads(hostile.value_sharing(4))
    assert small[3][0] is small[2] and small[2][0] is small[1]  # shared, not copied
    assert len(hostile.deep_nesting()) == 100_001
    assert hostile.call_with("submit_checkpoint_root", "size", b"\x01").startswith(b"pot1\x82")
