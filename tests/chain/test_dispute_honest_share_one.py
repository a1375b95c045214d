"""A core finding (challenges.verdict._dispute, since 040b299): `dispute_honest_share` = 1 is in its
range, (0, 1] (params.FRACTION_PARAMS), but a dispute round whose every revealed seat backs the
miner's value then has no verdict. HONEST needs more than all of the revealed seats, so the rule
takes the FRAUD branch, looks for the largest cluster with another value, finds none and raises
IndexError; on the chain the resolution fails (BlockWorkFailed) at every block and the run never
settles. Either the range must exclude 1 (ParamOutOfRange), or the rule must give every such round
a verdict. Strict xfail until the core does one of them: docs/protocol.md §14 names it."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from chain import protocol as P
from chain.protocol.events import BlockWorkFailed
from challenges.verdict import HONEST, Reveal, decide
from tests.chain.puretest import PureChain
from tests.chain.runs import SyntheticRun, bond, witness

REASON = "dispute_honest_share = 1 is accepted, and a unanimous dispute round then has no verdict"


@pytest.mark.xfail(strict=True, raises=IndexError, reason=REASON)
def test_a_unanimous_dispute_round_has_a_verdict_at_share_one():
    leaf, proof = b"\x01" * 32, b"\x02" * 32
    reveals = [Reveal(f"v{i}", leaf, 0, proof) for i in range(3)]
    result = decide(reveals, mode="value", opening_submitted=True, expected_value=leaf, quorum_min_reveals=1,
                    quorum_share=Fraction(1, 2), committee_size=3, dispute=True, refused_value=b"\xff" * 32,
                    seats={r.verifier: 1 for r in reveals}, honest_share=Fraction(1))
    assert result.verdict == HONEST


@pytest.mark.xfail(strict=True, reason=REASON)
def test_a_dispute_round_at_share_one_resolves_on_the_chain():
    params = P.ProtocolParams(max_rounds=1, challenges_per_run=1, dispute_honest_share=Fraction(1))
    chain, run = PureChain(params), SyntheticRun()
    chain.block(("miner", run.register()), *[(v, bond(params.verifier_stake)) for v in ("v1", "v2", "v3")])
    chain.block(("miner", run.submit_full_root()))
    for _ in range(60):
        if chain.of(P.RunSettled):
            break
        n, calls = chain.number + 1, []
        for ch in chain.state.challenges.values():
            if ch.verdict is not None:
                continue
            cid = ch.challenge_id
            if ch.opening is None:
                calls.append(("miner", run.opening(cid, ch.step)))
                continue
            for v in sorted(Counter(ch.committee)):
                com, rev = witness(cid, v, run.value_hash(ch.step))
                if n <= ch.commit_deadline and v not in ch.commitments:
                    calls.append((v, com))
                elif ch.commit_deadline < n <= ch.reveal_deadline and v in ch.commitments and v not in ch.reveals:
                    calls.append((v, rev))
        chain.block(*calls, strict=False)
    (dispute,) = chain.state.challenges.values()
    assert dispute.dispute and len(dispute.reveals) == 3, "every seat revealed the miner's value (the scenario)"
    failed = [e for e in chain.of(BlockWorkFailed) if e.stage == "resolution"]
    assert not failed, f"the resolution fails at every block: {failed[0]}"
    assert chain.of(P.RunSettled)
