"""The adversary matrix's key rows through real transports (`network` fixture: the dev chain and a
real Substrate runtime on chopsticks): calls travel as the chain carries them, signed by the
chain's accounts, and the verdict and who pays are read from a ChainView of finalized blocks.

Rows: a lazy verifier, Sybil garbage, split refusals, a stalled opening (on chain a stalled
download is the committee's one refused value, as split refusals are; the node's side of a stall,
a download that times out, is tested in tests/node). On chopsticks a bond counts only with its
transfer into the protocol's bond account in the same extrinsic, so the Sybils pay real value.
"""

from __future__ import annotations

import pytest

from chain import protocol as P
from chain.calls import BondVerifier
from challenges.refused import REFUSED_BUCKET, refused_pair
from commitments.hashing import digest
from tests.chain.runs import SyntheticRun, witness

# Every seat unit (verifier_stake of free bond) is a seat when the network holds no more units than
# the committee has seats: four verifiers here, with at most 8 units between them.
PARAMS = P.ProtocolParams(commit_window=8, reveal_window=8, opening_deadline=4, challenges_per_run=1,
                          challenge_delay=2, quorum_min_reveals=2, committee_size=8, max_rounds=3,
                          verifier_stake=100, no_show_penalty=50, outlier_penalty=50)
VERIFIERS = ("v1", "v2", "v3", "v4")


@pytest.fixture(params=["dev", pytest.param("chopsticks", marks=pytest.mark.chopsticks)])
def network(request, tmp_path):
    """conftest's transports, with this file's parameters (four verifiers, every unit on every committee)."""
    if request.param == "dev":
        from tests.chain.network import DevNetwork

        net = DevNetwork(PARAMS, tmp_path / "chain.db")
    else:
        from tests.chain.chopsticks_env import make_network

        net = make_network(PARAMS)
    try:
        yield net
    finally:
        net.close()


class Play:
    def __init__(self, network, bonds: dict[str, int], seed: str) -> None:
        self.net = network
        self.view = network.view()
        self.run = SyntheticRun(seed=seed, miner=network.account("miner"))
        for name, amount in bonds.items():
            self.submit(name, BondVerifier(amount=amount))
        bonded = {e.verifier: e.bond for e in self.view.of(P.VerifierBonded)}
        assert bonded == {network.account(n): b for n, b in bonds.items()}, bonded

    def submit(self, name: str, *calls) -> list[P.Event]:
        self.net.submit(name, *calls)
        return self.view.sync()

    def advance_to(self, number: int) -> None:
        head = self.net.transport("miner").finalized_head()
        if head < number:
            self.net.advance(number - head)
        self.view.sync()

    def first_challenge(self) -> P.ChallengeIssued:
        self.submit("miner", self.run.register())
        (root,) = [e for e in self.submit("miner", self.run.submit_full_root())
                   if isinstance(e, P.CheckpointRootUpdated)]
        self.advance_to(root.challenges_at)
        (ch,) = self.view.of(P.ChallengeIssued)
        return ch

    def round(self, ch: P.ChallengeIssued, act) -> P.ChallengeResolved:
        """The miner opens the round; each verifier's pair comes from act(name) ('refuse' or a pair)."""
        self.submit("miner", self.run.opening(ch.challenge_id, ch.step))
        names = [n for n in VERIFIERS if self.net.account(n) in ch.committee]
        pairs = {}
        for name in names:
            what = act(name, ch)
            value, proof = refused_pair(ch.challenge_id) if what == "refuse" else what
            bucket = REFUSED_BUCKET if what == "refuse" else 0
            pairs[name] = witness(ch.challenge_id, self.net.account(name), value, bucket, proof_hash=proof)
            self.submit(name, pairs[name][0])
        self.advance_to(ch.commit_deadline)
        for name in names:
            self.submit(name, pairs[name][1])
        self.advance_to(ch.escalate_deadline + 1)
        return next(e for e in self.view.of(P.ChallengeResolved) if e.challenge_id == ch.challenge_id)

    def play(self, act_by_round) -> list[P.ChallengeResolved]:
        ch, out = self.first_challenge(), []
        while True:
            res = self.round(ch, act_by_round(ch.round))
            out.append(res)
            if res.rechallenge is None:
                return out
            ch = next(e for e in self.view.of(P.ChallengeIssued) if e.challenge_id == res.rechallenge)

    def penalised(self) -> dict[str, int]:
        by_account = {self.net.account(n): n for n in ("miner", *VERIFIERS)}
        out: dict[str, int] = {}
        for e in self.view.of(P.VerifierPenalized):
            out[by_account[e.verifier]] = out.get(by_account[e.verifier], 0) + e.amount
        return out

    def slashed(self) -> int:
        return sum(e.amount for e in self.view.of(P.MinerSlashed))

    def honest(self, ch) -> tuple[bytes, bytes]:
        return self.run.value_hash(ch.step), digest("pot/test/replayed-proof/v1", ch.challenge_id)


@pytest.mark.slow
def test_lazy_verifier_pays(network):
    p = Play(network, {n: 100 for n in VERIFIERS}, "matrix-lazy")
    lazy = lambda ch: (p.run.value_hash(ch.step), digest("pot/test/made-up/v1", ch.challenge_id))  # noqa: E731
    rounds = p.play(lambda r: lambda name, ch: lazy(ch) if name == "v4" else p.honest(ch))
    assert [r.verdict for r in rounds] == ["honest"]
    assert p.penalised() == {"v4": PARAMS.outlier_penalty} and p.slashed() == 0


@pytest.mark.slow
def test_sybil_garbage_pays(network):
    p = Play(network, {"v1": 300, "v2": 300, "v3": 100, "v4": 100}, "matrix-sybil")
    garbage = (digest("pot/test/garbage/v1"), digest("pot/test/garbage-proof/v1"))
    rounds = p.play(lambda r: lambda name, ch: garbage if name in ("v3", "v4") else p.honest(ch))
    assert [r.verdict for r in rounds] == ["honest"] and rounds[0].cluster_size == 6
    assert p.penalised() == {"v3": 50, "v4": 50} and p.slashed() == 0


@pytest.mark.slow
@pytest.mark.parametrize("row", ["split refusals", "stalled opening"])
def test_refused_twice_is_fraud_and_nobody_else_pays(network, row):
    p = Play(network, {n: 100 for n in VERIFIERS}, f"matrix-{row}")
    rounds = p.play(lambda r: lambda name, ch: "refuse")
    assert [r.verdict for r in rounds] == ["inconclusive", "fraud"], [r.reason for r in rounds]
    assert rounds[0].rechallenge is not None and "second opening window" in rounds[0].reason
    assert p.penalised() == {} and p.slashed() == PARAMS.slash_amount
