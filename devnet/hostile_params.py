"""Hostile-input probes, second round: an out-of-range or unpinned configure_network record.
Registered in devnet.hostile."""

from __future__ import annotations

from pathlib import Path

from chain.calls import ConfigureNetwork
from chain.dev import DevTransport
from chain.protocol import ProtocolParams, ProtocolState
from chain.protocol.events import CallRefused, NetworkConfigured
from chain.view import ChainView
from commitments import cbor
from devnet.hostile import _honest_registration, _owned, probe
from devnet.lab import Lab, bond_seats

KIND = "a hostile authority record"
OPERATOR = "operator"  # the account that creates each probe's chain: its authority


def _record(lab: Lab, effective: int, **changes: int) -> ConfigureNetwork:
    """A configure_network record of the lab's parameters with `changes`, written as canonical CBOR
    by hand (ProtocolParams itself refuses to hold an out-of-range value)."""
    d = lab.params.to_dict()
    d.update(changes)
    return ConfigureNetwork(params=cbor.encode(d), effective_block=effective)


def _chain_with_record(lab: Lab, name: str, sender: str, record: ConfigureNetwork) -> tuple[Path, bytes]:
    """A fresh instant dev chain made by OPERATOR: `sender`'s record in block 1, the committees'
    seats bonded (block 2), an honest registration (blocks 3-4) and blocks sealed past the record's
    effective block and the stalls a huge delay would cause (the next challenge draw, the next
    snapshot)."""
    path = lab.dir / "hostile" / f"{name}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    operator = DevTransport(path, OPERATOR, sealing="instant")
    operator.record_params(lab.params)
    DevTransport(path, sender).submit([record])
    bond_seats(path, lab.params)  # the committees' seats: the honest run's challenges are drawn
    run_id, nonce = _owned("miner", f"honest-after-{name}")
    miner = DevTransport(path, "miner")
    calls = _honest_registration(lab, run_id, nonce)
    miner.submit(calls[:1])
    miner.submit(calls[1:])
    for _ in range(lab.params.challenge_delay + 6):
        operator.seal()
    for t in (operator, miner):
        t.close()
    return path, run_id


def _follow(path: Path) -> tuple[ChainView | None, str]:
    """The chain view every node runs, from genesis to the head, then its snapshot round trip."""
    t = DevTransport(path, "observer")
    view = ChainView(t, t.protocol_params())
    try:
        view.sync()
        again = ProtocolState.from_cbor(view.state.to_cbor())
    except Exception as exc:  # what a node's loop would meet
        return (
            None,
            f"the follower stopped at block {view.cursor + 1}: {type(exc).__name__}: {str(exc)[:120]}",
        )
    if view.cursor != t.finalized_head():
        return None, f"the cursor stopped at {view.cursor} of {t.finalized_head()}"
    if again.params != view.state.params:
        return None, "the snapshot did not round-trip"
    return view, ""


def _refused_in_range(lab: Lab, name: str, **changes: int) -> tuple[bool, str, str]:
    path, run_id = _chain_with_record(lab, name, OPERATOR, _record(lab, 3, **changes))
    view, why = _follow(path)
    if view is None:
        return False, "chain", why
    refused = [e for e in view.events if isinstance(e, CallRefused) and e.block == 1]
    if not refused or refused[0].refusal != "ParamOutOfRange":
        got = refused[0].refusal if refused else "no refusal (the record was accepted)"
        return False, "chain", f"the record came out as {got}, not ParamOutOfRange"
    if view.state.params != lab.params or view.state.schedule:
        return False, "chain", "the out-of-range parameters were kept"
    if run_id not in view.state.runs:
        return False, "chain", "the honest registration after the record was not applied"
    why = refused[0].reason.split(": ", 1)[-1][:100]
    return True, "chain", (f"refused with ParamOutOfRange ({why}); read to block "
                           f"{view.cursor} and its snapshot round-trips")


@probe(
    "opening-deadline-out-of-range",
    KIND,
    "refuse a configure_network record with opening_deadline = 2^63 as ParamOutOfRange and follow the chain "
    "past it",
)
def _opening_deadline(lab: Lab) -> tuple[bool, str, str]:
    return _refused_in_range(lab, "opening-deadline-out-of-range", opening_deadline=1 << 63)


@probe(
    "unbonding-delay-out-of-range",
    KIND,
    "refuse a configure_network record with unbonding_delay = 2^64 - 1 as ParamOutOfRange; the follower and "
    "its snapshot go on",
)
def _unbonding_delay(lab: Lab) -> tuple[bool, str, str]:
    return _refused_in_range(lab, "unbonding-delay-out-of-range", unbonding_delay=(1 << 64) - 1)


@probe(
    "max-rounds-out-of-range",
    KIND,
    "refuse a configure_network record with max_rounds = 2^31 (a challenge's round is an INTEGER column of "
    "the "
    "node database) as ParamOutOfRange and follow the chain past it",
)
def _max_rounds(lab: Lab) -> tuple[bool, str, str]:
    return _refused_in_range(lab, "max-rounds-out-of-range", max_rounds=1 << 31)


@probe(
    "unpinned-authority-record",
    KIND,
    "refuse a stranger's first configure_network record on a chain whose authority is unpinned in the node "
    "config (NotAuthority: the chain names its creator); the creator's record still configures it",
)
def _stranger(lab: Lab) -> tuple[bool, str, str]:
    taken = ProtocolParams.from_dict({**lab.params.to_dict(), "commit_window": lab.params.commit_window + 7,
                                      "slash_amount": 0})
    path, run_id = _chain_with_record(lab, "unpinned-authority-record", "mallory",
                                      ConfigureNetwork(params=taken.to_cbor(), effective_block=3))
    own = DevTransport(path, OPERATOR)
    own.submit([ConfigureNetwork(params=lab.params.to_cbor(), effective_block=own.finalized_head() + 3)])
    own.seal(), own.seal(), own.seal()
    own.close()
    view, why = _follow(path)
    if view is None:
        return False, "chain", why
    refused = [e for e in view.events if isinstance(e, CallRefused) and e.block == 1]
    if not refused or (refused[0].origin, refused[0].refusal) != ("mallory", "NotAuthority"):
        return False, "chain", "the stranger's record was not refused as NotAuthority"
    if view.state.authority != OPERATOR or view.state.params == taken:
        return (
            False,
            "chain",
            f"the network's authority is {view.state.authority}, parameters {view.state.params}",
        )
    if not any(isinstance(e, NetworkConfigured) and e.authority == OPERATOR for e in view.events):
        return False, "chain", "the creator's own record was not accepted"
    if run_id not in view.state.runs:
        return False, "chain", "the honest registration after the record was not applied"
    return (
        True,
        "chain",
        "refused with NotAuthority; the chain's creator configures it and the follower read on",
    )
