"""The `network` fixture: the one protocol suite runs over every transport."""

from __future__ import annotations

import pytest

from chain.protocol import ProtocolParams
from tests.chain.network import DevNetwork

# Small windows keep the suite fast; three reveals make a quorum (the suite uses v1..v3).
SUITE_PARAMS = ProtocolParams(
    commit_window=4,
    reveal_window=4,
    opening_deadline=4,
    challenges_per_run=1,
    challenge_delay=2,
    quorum_min_reveals=3,
    miner_stake=1000,
    verifier_stake=100,
    slash_amount=500,
)


@pytest.fixture(params=["dev", pytest.param("chopsticks", marks=pytest.mark.chopsticks)])
def network(request, tmp_path):
    if request.param == "dev":
        net = DevNetwork(SUITE_PARAMS, tmp_path / "chain.db")
    else:
        from tests.chain.chopsticks_env import make_network

        net = make_network(SUITE_PARAMS)
    try:
        yield net
    finally:
        net.close()
