"""The pallet transport checks the runtime's metadata first: a runtime without the PoT pallet (the
chopsticks Asset Hub) is refused with the missing pallet named and the remark transport suggested."""

from __future__ import annotations

import pytest

from chain.calls import CALL_TYPES
from chain.substrate import PalletConfig, PalletMissingError, connect_substrate
from tests.chain.chopsticks_env import Chopsticks, chopsticks, unique_key  # noqa: F401

pytestmark = pytest.mark.chopsticks


def test_runtime_without_pallet_is_refused(chopsticks: Chopsticks):  # noqa: F811
    with pytest.raises(PalletMissingError) as exc:
        connect_substrate(chopsticks.url, unique_key("p"), kind="pallet")
    msg = str(exc.value)
    assert "no pallet 'ProofOfTraining'" in msg
    assert "substrate-remark" in msg and "kind='remark'" in msg
    assert "Utility" in msg  # lists what the runtime does have


def test_configured_pallet_name_is_used(chopsticks: Chopsticks):  # noqa: F811
    with pytest.raises(PalletMissingError, match="no pallet 'PoT'"):
        connect_substrate(chopsticks.url, unique_key("p"), kind="pallet", pallet={"pallet": "PoT"})


def test_existing_pallet_without_the_calls_is_refused(chopsticks: Chopsticks):  # noqa: F811
    # Utility exists on this runtime but has none of the protocol's calls.
    with pytest.raises(PalletMissingError, match="pallet 'Utility' has no call 'start_training_commitment'"):
        connect_substrate(
            chopsticks.url, unique_key("p"), kind="pallet", pallet=PalletConfig(pallet="Utility")
        )


def test_call_with_other_arguments_is_refused(chopsticks: Chopsticks):  # noqa: F811
    # System.remark exists, but takes (remark), not the protocol call's arguments.
    cfg = {"pallet": "System", "calls": dict.fromkeys(CALL_TYPES, "remark")}
    with pytest.raises(PalletMissingError, match=r"System.remark takes \(remark\), the protocol call"):
        connect_substrate(chopsticks.url, unique_key("p"), kind="pallet", pallet=cfg)
