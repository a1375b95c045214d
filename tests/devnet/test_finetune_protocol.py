"""The demo's whole protocol on a fine-tune: a tiny Llama saved by transformers is imported
(`pot model import`), an honest miner and one whose step trains on a substituted batch fine-tune
it on one dev chain with the real Trainer, three bonded verifiers (one revealing noise) fetch each
opening, validate it against the chain, replay it, and each seated one commits and reveals the
witness pair; the chain's verdicts: honest for the honest run and the substituted run's step 1
(whose opening carries the pretrained state), fraud for the substituted step, the noisy verifier an
outlier on every seat it holds and penalised from its seats' collateral, the winning seats paid."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from typer.testing import CliRunner

from chain.dev import DevTransport
from chain.protocol import (
    ChallengeIssued,
    ChallengeResolved,
    MinerSlashed,
    OpeningSubmitted,
    ProtocolParams,
    RunRegistered,
    VerifierOutlier,
    VerifierPaid,
)
from chain.protocol.events import VerifierPenalized
from chain.view import ChainView
from challenges.opening import load_opening, validate_opening
from challenges.replay import replay
from challenges.verdict import FRAUD, HONEST
from commitments.dataset import Dataset
from commitments.spec import Spec
from miner.cli import model_app
from miner.trainer import Trainer, TrainerError
from tests.miner.helpers import bond_verifiers, corpus, witness_calls

transformers = pytest.importorskip("transformers")

STEPS, SUBSTITUTED = 3, 3
# Every submit seals a block (instant sealing): the windows leave room for all four challenges.
# A seat unit per 100 of free bond, drawn without replacement: 9 + 9 + 2 units are the four
# challenges' 20 seats exactly, so they sit side by side and every unit sits once; v3 (2 units)
# never holds a majority of a committee's five seats and pays 10 a seat.
PARAMS = ProtocolParams(commit_window=30, reveal_window=30, opening_deadline=20, challenge_delay=1,
                        quorum_min_reveals=2, challenges_per_run=2, forced_challenge_steps=(1, SUBSTITUTED),
                        outlier_penalty=10, no_show_penalty=10)
VERIFIERS = ("v1", "v2", "v3")  # v3 reveals noise
BONDS = {"v1": 900, "v2": 900, "v3": 200}


def _import(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   bos_token_id=0, eos_token_id=0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    init = tmp_path / "init.safetensors"
    r = CliRunner().invoke(
        model_app, ["import", str(tmp_path / "hf"), "--from", "hf-llama", "--out", str(init)]
    )
    assert r.exit_code == 0, r.output
    tables = r.stdout[r.stdout.index("[model]"):]
    (tmp_path / "spec.toml").write_text(f"steps = {STEPS}\n{tables}\n[batch]\nbatch_size = 4\nseq_len = 16\n"
                                        f"[optimizer]\nlr = 1e-3\nweight_decay = 0.1\n[rng]\nseed = 7\n"
                                        f"schedule_seed = 11\n")
    return Spec.from_toml(tmp_path / "spec.toml"), init


def _seal_until(chain, trainers, cond, limit=100):
    for _ in range(limit):
        if cond():
            return
        chain.seal()
        for tr in trainers:
            tr.poll()
    raise AssertionError("condition not reached")


@pytest.mark.slow
def test_finetune_protocol_catches_a_substituted_batch(tmp_path):
    spec, init = _import(tmp_path)
    assert spec.model.kind == "llama" and spec.init is not None
    data = corpus(tmp_path)
    ds = Dataset.open(data, spec.sample_len, vocab_size=spec.model.vocab_size)
    db = tmp_path / "chain.db"
    sealer = DevTransport(db, "sealer", sealing="instant")
    sealer.record_params(PARAMS)
    for name, amount in BONDS.items():  # before any challenge: committees are drawn from bonded verifiers
        bond_verifiers(db, [name], amount)
    with pytest.raises(TrainerError, match="give their file"):
        Trainer(spec, ds, tmp_path / "none", None)
    trainers = {}
    for name, fault in (("honest", None), ("substituted", SUBSTITUTED)):
        tr = Trainer(spec, ds, tmp_path / name, DevTransport(db, f"miner-{name}", sealing="instant"),
                     keep_every=2, substitute_batch_at=fault, progress=False, log=lambda m: None,
                     endpoint="http://miner.example:8760/", pretrained=init)
        tr.prepare()
        tr.register()
        tr.train()
        tr.submit_root()
        trainers[name] = tr
    both = list(trainers.values())
    _seal_until(sealer, both, lambda: all(len(tr.answered) == 2 for tr in both))

    view = ChainView(sealer, PARAMS)
    view.sync()
    regs = {e.run_id: e for e in view.of(RunRegistered)}
    issued = {e.challenge_id: e for e in view.of(ChallengeIssued)}
    reveals = {}
    for opened in view.of(OpeningSubmitted):
        reg, ch = regs[opened.run_id], issued[opened.challenge_id]
        tr = next(t for t in both if t.run_id == opened.run_id)
        v = validate_opening(load_opening(tr.store.opening_path(opened.opening_digest)),
                             expected_digest=opened.opening_digest, run_id=reg.run_id, step=ch.step,
                             spec_digest=reg.spec_digest, dataset_hash=reg.dataset_hash,
                             schedule_commitment=reg.schedule_commitment, initial_hash=reg.initial_hash,
                             root=ch.root, size=ch.size)
        if ch.step == 1:  # the opening of step 1 carries the pretrained state
            assert v.state.digest() == reg.initial_hash
        result = replay(v)
        assert set(ch.committee) <= set(VERIFIERS) and len(ch.committee) == PARAMS.committee_size
        for name in sorted(set(ch.committee)):  # only a seated account commits
            noise = {"value_hash": os.urandom(32), "proof_hash": os.urandom(32)} if name == "v3" else {}
            commit, reveals[name, ch.challenge_id] = witness_calls(ch.challenge_id, name, result, **noise)
            DevTransport(db, name, sealing="instant").submit([commit])
    last_commit = max(ch.commit_deadline for ch in issued.values())
    _seal_until(sealer, both, lambda: sealer.finalized_head() > last_commit)
    for (name, _), reveal in reveals.items():
        DevTransport(db, name, sealing="instant").submit([reveal])
    _seal_until(sealer, both, lambda: all(len(tr.resolved) == 2 for tr in both))

    view.sync()
    verdicts = {(e.run_id, e.step): e for e in view.of(ChallengeResolved)}
    h, s = trainers["honest"].run_id, trainers["substituted"].run_id
    assert {k: e.verdict for k, e in verdicts.items()} == {
        (h, 1): HONEST, (h, SUBSTITUTED): HONEST, (s, 1): HONEST, (s, SUBSTITUTED): FRAUD}
    seats = {cid: Counter(e.committee) for cid, e in issued.items()}  # a seat per verifier_stake of free bond
    assert sum(seats.values(), Counter()) == {v: b // PARAMS.verifier_stake for v, b in BONDS.items()}
    assert all(e.cluster_size == seats[e.challenge_id]["v1"] + seats[e.challenge_id]["v2"]
               and e.reveals == len(seats[e.challenge_id])
               and e.outliers == (("v3",) if seats[e.challenge_id]["v3"] else ()) for e in verdicts.values())
    assert [e.run_id for e in view.of(MinerSlashed)] == [s]
    assert {e.verifier for e in view.of(VerifierOutlier)} == {"v3"}
    penalties = view.of(VerifierPenalized)
    assert {(e.verifier, e.why) for e in penalties} == {("v3", "outlier")}
    assert len(penalties) == sum(1 for c in seats.values() if c["v3"])
    assert sum(e.amount for e in penalties) == PARAMS.outlier_penalty * 2  # v3's two seats
    paid = Counter()
    for e in view.of(VerifierPaid):
        paid[e.verifier] += e.amount
    assert paid["v1"] > 0 and paid["v2"] > 0 and paid["v3"] == 0  # the winning seats' fees and slash share
    assert view.state.vbonds == {"v1": BONDS["v1"] + paid["v1"], "v2": BONDS["v2"] + paid["v2"],
                                 "v3": BONDS["v3"] - sum(e.amount for e in penalties)}
    assert view.state.reserved == {}
    for tr in both:
        tr.close()
