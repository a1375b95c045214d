"""Protocol v3's adversary rows for findings 1-5 (devnet/protocol_matrix.py: row_commit_flood,
row_half_served_dispute, row_dust_bonds, row_one_bond_many_committees, row_lazy_majority_escalated)
end to end: a dev chain (`pot chain dev`), real miners (`pot miner train`, honest or forging a step
with `--substitute-batch-at`), real honest verifier nodes (`pot node run`), and an adversary the
test scripts, acting through the dev chain's transport with accounts of its own. Every assertion
reads the chain (events and state through a ChainView), never the adversary's own bookkeeping.

Two networks serve the five rows, each played once by a module fixture and stopped before its
tests read the chain it left: `net_a` here (findings 1, 3 and 4), `net_b` in
test_adversary_v3_dispute_e2e.py (findings 2 and 5, both ending in a dispute round), so that a
parallel suite (`--dist loadfile`) runs them side by side. tests/e2e/adversary.py holds the
adversary and what both read off the chain.

* `net_a` (an honest miner, the two challenges of its run open side by side, committees of 18
  seats drawn from the 36 seat units bonded at the first draw, so the two draws between them seat
  (nearly) every unit):
  - finding 3, dust bonds: before any node starts, 256 accounts bond 1 unit each (refused
    BondBelowMinimum) and the one-bond account tries to unbond down to dust (refused the same); the
    three real nodes, all started after the flood, bond and serve.
  - finding 1, commit flood: four least-bond Sybils send their commitments (garbage) as soon as a
    round they sit on is issued, before its opening is on chain: refused NoOpening; sent again
    after the opening, taken; an account that bonds after the first draw commits to it (refused
    NotInCommittee) and then plays a Sybil. The honest nodes' reveals decide both rounds (honest)
    and every seated Sybil pays an outlier penalty a seat.
  - finding 4, one bond on many committees: an account bonded 2 x verifier_stake never commits. The
    draws are random (the test does not choose block hashes), but with every unit seated by one of
    the two committees (at most one left over, when the late account's unit joins the second
    draw) it sits; the chain never gives it more seats at once than its bond backs, every absence
    is paid in full from its seats, and every account's bond is what its bonds, payments and
    penalties on chain add up to.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from chain import protocol as P
from chain.calls import BondVerifier, UnbondVerifier
from chain.protocol import ProtocolParams
from chain.view import ChainView
from commitments.hashing import digest
from tests.e2e.adversary import (
    FETCH,
    TRAIN_TIMEOUT,
    WINDOWS,
    Adversary,
    Witnesses,
    alive,
    books,
    commit_pair,
    penalties,
    rounds_of,
    run_id_of,
    until,
)
from tests.e2e.cluster import TINY_GPT, Cluster
from tests.miner.helpers import corpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# --- network A: an honest run, two challenges side by side ------------------------------------

# Each node replays both challenges, one after the other: a longer commit window.
A_PARAMS = ProtocolParams(**WINDOWS, commit_window=100, challenges_per_run=2, committee_size=18, max_rounds=3)
A_NODES = ["v1", "v2", "v3"]
A_BOND = 1000  # 10 seat units a node: 30 of the 36 units the two draws share
SYBILS = ["s0", "s1", "s2", "s3"]
ONE = "w"  # the one bond of finding 4
DUST = [f"dust{i:03d}" for i in range(256)]


@pytest.fixture(scope="module")
def net_a(tmp_path_factory):
    """The network's whole play, its processes stopped before the tests read the chain it left."""
    tmp = tmp_path_factory.mktemp("net_a")
    cluster = Cluster(tmp, A_PARAMS)
    adv = Adversary(cluster)
    started = time.monotonic()
    try:
        vs = A_PARAMS.verifier_stake
        # finding 3: dust against the registry, before any node is up
        for name in DUST:
            adv.send(name, BondVerifier(amount=1), keep=False)
        adv.send(ONE, BondVerifier(amount=2 * vs))
        for s in SYBILS:
            adv.send(s, BondVerifier(amount=vs))
        until(cluster, lambda v: v.state.vbonds.get(ONE) == 2 * vs
              and all(v.state.vbonds.get(s) for s in SYBILS), "the adversary's bonds")
        adv.send(ONE, UnbondVerifier(amount=2 * vs - vs // 2))  # would leave dust
        flooded = until(cluster, lambda v: any(e.origin == ONE for e in v.of(P.CallRefused)),
                        "the dust unbond")
        # the real nodes, every one started after the flood
        for name in A_NODES:
            cluster.start_verifier(name, bond=A_BOND, fetch=FETCH)
        cluster.wait_bonded(A_NODES)

        garbage = lambda view, ch, who: (digest("pot/e2e/garbage/v1", ch.challenge_id),  # noqa: E731
                                         digest("pot/e2e/garbage-proof/v1", ch.challenge_id))
        sybils = set(SYBILS)
        flood = Witnesses(adv, lambda: set(sybils), garbage, early=True)
        late: dict[str, int] = {}

        def strategy(view: ChainView) -> None:
            flood(view)
            issued = view.of(P.ChallengeIssued)
            if issued and "late" not in late:  # bonds after the first draw and commits to it
                first = issued[0]
                late["late"] = view.cursor
                adv.send("late", BondVerifier(amount=vs),
                         commit_pair(first.challenge_id, "late", *garbage(view, first, "late"))[0])
                sybils.add("late")  # and acts as a Sybil wherever a later draw seats it

        adv.play(strategy)
        spec = tmp / "spec.toml"
        spec.write_text(TINY_GPT.format(steps=6))
        rc, summary = cluster.train(spec, corpus(tmp), steps_timeout=TRAIN_TIMEOUT)
        alive(cluster, A_NODES)
        assert not adv.errors, adv.errors
        view = cluster.view()
        return cluster, view, rc, summary, flooded.cursor
    finally:
        adv.close()
        cluster.close()
        print(f"\nnet_a: {time.monotonic() - started:.0f} s")


def test_dust_bonds_are_refused_and_new_real_nodes_bond_and_serve(net_a):
    cluster, view, rc, summary, flood_block = net_a
    refused = [e for e in view.of(P.CallRefused) if e.refusal == "BondBelowMinimum"]
    assert sorted(e.origin for e in refused if e.origin in DUST) == DUST
    assert [(e.origin, e.call) for e in refused if e.origin not in DUST] == [(ONE, "unbond_verifier")]
    assert view.of(P.VerifierUnbonding) == []
    assert not set(DUST) & set(view.state.verifiers), "a dust account is in the verifier registry"
    # every real node bonded after the flood, was seated and paid for winning seats
    bonded = {e.verifier: e.block for e in view.of(P.VerifierBonded)}
    paid = Counter()
    for e in view.of(P.VerifierPaid):
        paid[e.verifier] += e.amount
    seated = Counter(a for e in view.of(P.ChallengeIssued) for a in e.committee)
    for name in A_NODES:
        assert bonded[name] > flood_block, (name, bonded[name], flood_block)
        assert seated[name] > 0 and paid[name] > 0, (name, seated, paid)


def test_commit_flood_before_the_opening_is_refused_and_honest_reveals_decide(net_a):
    cluster, view, rc, summary, _ = net_a
    assert rc == 0, cluster.err("miner")[-3000:]
    run = run_id_of(view, "miner")
    rounds = rounds_of(view, run)
    assert [(i.round, r.verdict) for i, r in rounds] == [(1, "honest")] * 2, [r.reason for _, r in rounds]
    opened = {e.challenge_id: e.block for e in view.of(P.OpeningSubmitted)}
    adversary = set(SYBILS) | {"late"}
    early = [e for e in view.of(P.CallRefused) if e.refusal == "NoOpening"]
    # the commitments sent before the opening were refused, and only those: every one in a block
    # no later than the opening of a round its sender sits on
    assert early, "no commitment reached the chain before an opening"
    for e in early:
        assert e.origin in adversary and e.call == "commit_witness", e
        assert any(e.origin in i.committee and e.block <= opened[i.challenge_id] for i, _ in rounds), e
    unseated = [e for e in view.of(P.CallRefused) if e.refusal == "NotInCommittee"]
    assert [e.origin for e in unseated] == ["late"], unseated
    committed = {(e.challenge_id, e.verifier) for e in view.of(P.WitnessCommitted)}
    pen = penalties(view)
    for issued, res in rounds:
        seats = Counter(issued.committee)
        for who in adversary & set(seats):  # each seated Sybil's commitment taken, whatever the order
            assert (issued.challenge_id, who) in committed, (who, issued.challenge_id.hex()[:16])
            assert who in res.outliers
            assert pen[(issued.challenge_id, who)] == [("outlier", A_PARAMS.outlier_penalty * seats[who])]
        # the honest nodes' reveals decide: every one of them in the winning cluster
        assert res.cluster_size == sum(seats[n] for n in A_NODES), (res.cluster_size, seats)
        assert not set(A_NODES) & set(res.outliers)
    assert not any(who in A_NODES for _, who in pen), pen
    assert any(e.origin in SYBILS for e in early)


def test_one_bond_sits_on_no_more_seats_than_it_backs_and_pays_in_full(net_a):
    cluster, view, rc, summary, _ = net_a
    vs = A_PARAMS.verifier_stake
    rounds = rounds_of(view, run_id_of(view, "miner"))
    spans = [(i.block, r.block, i.committee.count(ONE), i.challenge_id)
             for i, r in rounds if ONE in i.committee]
    assert spans, f"{ONE} sat on none of {len(rounds)} committees"
    # at every issuance, the seats it holds on open rounds are backed by its bond then
    # (a block's draws come before its resolutions: a round resolving at the block still holds its
    # seats, and its penalties are not taken yet)
    bond_at = lambda n: 2 * vs - sum(e.amount for e in view.of(P.VerifierPenalized)  # noqa: E731
                                     if e.verifier == ONE and e.block < n)
    holding = {start: sum(k for s, end, k, _ in spans if s <= start <= end) for start, _, _, _ in spans}
    for start, k in holding.items():
        assert k * vs <= bond_at(start), (start, k, bond_at(start))
    most = max(holding.values())
    assert 1 <= most <= 2
    # every absence paid in full: no_show_penalty a seat, on each round it sat on
    pen = penalties(view)
    for _, _, k, cid in spans:
        assert pen[(cid, ONE)] == [("no_commit", A_PARAMS.no_show_penalty * k)], pen.get((cid, ONE))
    total = sum(k for _, _, k, _ in spans)
    assert view.state.vbonds[ONE] == 2 * vs - A_PARAMS.no_show_penalty * total
    assert books(view) == []
    print(f"\n{ONE}: {total} seat(s) over {len(spans)} rounds, at most {most} at once")


