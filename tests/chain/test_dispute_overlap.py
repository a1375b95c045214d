"""Two escalations of one honest run, one block apart: the first dispute round seats every free
unit of the network, so the second finds none free, sits no seat, and ends unresolved -- the
honest miner's stake stays locked and its escrow is burned (found by bench/incentives.py)."""

from __future__ import annotations

from collections import Counter

from chain import protocol as P
from chain.calls import EscalateChallenge
from commitments.hashing import digest
from tests.chain.puretest import PureChain
from tests.chain.runs import SyntheticRun, bond, witness

PARAMS = P.ProtocolParams(challenges_per_run=2)
VERIFIERS = ("v1", "v2", "v3", "v4")  # 20 seat units each: free bond to escalate with seats held


def _play(chain: PureChain, run: SyntheticRun, last: int) -> None:
    """Every seat commits once the opening is on chain; in a first round the first seated account
    reveals a wrong value, the rest the true one, and the outvoted side escalates; in the dispute
    round every seat reveals the true value."""
    while chain.number < last and not chain.of(P.RunSettled):
        n, calls = chain.number + 1, []
        for ch in chain.state.challenges.values():
            if ch.verdict is not None:
                continue
            cid = ch.challenge_id
            if ch.opening is None:
                calls.append(("miner", run.opening(cid, ch.step)))
                continue
            seats = sorted(Counter(ch.committee))
            wrong = set() if ch.dispute else set(seats[:1])
            for v in seats:
                value = digest("pot/test/wrong/v1", cid) if v in wrong else run.value_hash(ch.step)
                com, rev = witness(cid, v, value)
                if n <= ch.commit_deadline and v not in ch.commitments:
                    calls.append((v, com))
                elif (
                    ch.commit_deadline < n <= ch.reveal_deadline
                    and v in ch.commitments
                    and v not in ch.reveals
                ):
                    calls.append((v, rev))
                elif (ch.reveal_deadline < n <= ch.escalate_deadline and not ch.dispute and v in ch.reveals
                      and P.round_result(chain.state, cid).winning_value != ch.reveals[v][0]):
                    calls.append((v, EscalateChallenge(cid)))  # the outvoted seats escalate
        chain.block(*calls, strict=False)


def test_overlapping_disputes_release_an_honest_miners_stake():
    chain, run = PureChain(PARAMS), SyntheticRun()
    chain.block(("miner", run.register()), *[(v, bond(20 * PARAMS.verifier_stake)) for v in VERIFIERS])
    chain.block(("miner", run.submit_full_root()))
    _play(chain, run, 400)
    escalated = {e.challenge_id for e in chain.of(P.ChallengeEscalated)}
    assert len(escalated) == 2, "both first rounds are escalated (the scenario under test)"
    disputes = [c for c in chain.state.challenges.values() if c.dispute]
    (settled,) = chain.of(P.RunSettled)
    # The miner opened every round with its committed, correct leaf: it did nothing wrong.
    assert not chain.of(P.MinerSlashed)
    assert all(c.committee for c in disputes), [len(c.committee) for c in disputes]
    assert settled.unresolved == 0 and settled.stake_released == PARAMS.miner_stake
