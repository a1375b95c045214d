"""A network's one rulebook: the protocol parameters its chain records, and the check every
participant (node, miner, `pot chain events`) makes before it follows the chain.

The parameters are chain state. They are fixed by `configure_network` records (chain.calls) of
the network's authority, and each takes effect at its stated block, after the block that carries
it. The authority is the account the chain names (`Transport.network_authority`: a dev chain's
creator) or the one a participant pins (`[chain] authority`, `--authority`); they must agree. Only
a participant with neither (a reader of a Substrate chain with no pin) lets the first accepted
record name it; a node refuses to start that way. A dev
chain file may also record parameters of its own (`pot chain dev --params`): those hold from
genesis. `read_network` replays only these records up to a block; `resolve_params` compares them
with what a participant pins and refuses, naming every difference, when they disagree or when the
chain records none and none are pinned.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from chain.calls import ConfigureNetwork
from chain.protocol.events import CallRefused, Event, NetworkConfigured
from chain.protocol.params import ProtocolParams
from chain.protocol.rules import activate_due, apply_recorded
from chain.protocol.state import ProtocolState
from chain.transport import Transport


class NetworkParamsError(ValueError):
    """A participant's parameters cannot be settled against the chain's; the message says why."""


@dataclass
class NetworkRecord:
    """What a chain says of its parameters up to block `upto`."""

    upto: int
    genesis: ProtocolParams | None  # recorded by the chain itself (a dev chain file), from block 0
    first: ProtocolParams | None  # the parameters of the first accepted configure_network record
    state: ProtocolState  # authority, the record in effect, the changes still scheduled at `upto`
    records: list[NetworkConfigured] = field(default_factory=list)
    refused: list[CallRefused] = field(default_factory=list)  # records from others than the authority, ...
    at: NetworkRecord | None = None  # the record as of an earlier block (read_network(at=...))

    @property
    def authority(self) -> str | None:
        return self.state.authority

    @property
    def current(self) -> ProtocolParams | None:
        """The parameters in effect at `upto`; before the first record takes effect, that record's
        (a network is configured before its first call), else the chain's own, else None."""
        if self.state.configured_at is not None:
            return self.state.params
        return self.first or self.genesis

    @property
    def initial(self) -> ProtocolParams | None:
        """What a follower replaying from block 0 starts with."""
        return self.genesis or self.first

    def source(self) -> str:
        if self.state.configured_at is not None:
            return f"the configure_network record of block {self.state.configured_at} by {self.authority}"
        if self.records:
            r = self.records[0]
            return (
                f"the configure_network record of block {r.block} by {r.authority} "
                f"(effective at {r.effective_block})"
            )
        if self.genesis is not None:
            return "the dev chain file"
        return "nothing"


def read_network(transport: Transport, upto: int, *, authority: str | None = None, since: int = 1,
                 at: int | None = None) -> NetworkRecord:
    """Replay the chain's network records from block `since` to `upto` (the other calls are not
    applied: the records depend on nothing else). `authority` pins who may configure. With `at`
    (since - 1 <= at <= upto), the record as of block `at` is kept too, as `.at`."""
    genesis = transport.protocol_params()
    authority = network_authority(transport, authority)
    state = ProtocolState(params=genesis or ProtocolParams(), authority=authority)
    rec = NetworkRecord(upto, genesis, None, state)
    first = max(1, since)
    if at is not None and at < first:
        rec.at = _frozen(rec, at)
    for n in range(first, upto + 1):
        block = transport.block(n)
        activate_due(state, n)
        for origin, call in block.calls:
            if not isinstance(call, ConfigureNetwork):
                continue
            for ev in apply_recorded(state, call, origin, n):
                _note(rec, ev)
        if at == n:
            rec.at = _frozen(rec, n)
    state.head = upto
    if rec.at is None:
        rec.at = rec
    return rec


def network_authority(transport: Transport, pinned: str | None = None) -> str | None:
    """The account whose configure_network records count: the one the chain names, else the pin
    (None: neither, and the first accepted record names it). NetworkParamsError when the pin
    disagrees with the chain."""
    named = transport.network_authority()
    if named is not None and pinned is not None and pinned != named:
        raise NetworkParamsError(
            f"the pinned authority {pinned} is not the network's: the chain names {named} "
            f"as the account that configures it; drop the pin or fix it"
        )
    return named if named is not None else pinned


def _frozen(rec: NetworkRecord, n: int) -> NetworkRecord:
    return NetworkRecord(
        n, rec.genesis, rec.first, copy.deepcopy(rec.state), list(rec.records), list(rec.refused)
    )


def start_params(rec: NetworkRecord, pinned: ProtocolParams | None, *, pin_name: str) -> ProtocolParams:
    """The parameters a follower starting after block `rec.at.upto` begins with, checked: the pin
    must equal what the chain has in effect at `rec.upto` (its head). Before the chain's first
    record, a follower begins with that record's parameters (it will apply the record itself)."""
    check_pinned(rec, pinned, pin_name=pin_name)
    start = rec.at if rec.at is not None else rec
    if start.state.configured_at is not None:
        return start.state.params
    return rec.initial or pinned  # type: ignore[return-value]  (check_pinned: one of them is set)


def _note(rec: NetworkRecord, ev: Event) -> None:
    if isinstance(ev, NetworkConfigured):
        if rec.first is None:
            rec.first = ProtocolParams.from_dict(ev.params)
        rec.records.append(ev)
    elif isinstance(ev, CallRefused):
        rec.refused.append(ev)


def check_pinned(rec: NetworkRecord, pinned: ProtocolParams | None, *, pin_name: str) -> ProtocolParams:
    """The parameters to follow from `rec.upto` on, or NetworkParamsError naming why there are none."""
    chain = rec.current
    if chain is None:
        if pinned is None:
            raise NetworkParamsError(
                "the chain records no protocol parameters (no configure_network record up to block "
                f"{rec.upto}"
                f"{'' if rec.authority is None else ' from ' + rec.authority}) and none are pinned: "
                "configure "
                f"the network (`pot chain configure`) or pin them ({pin_name})"
            )
        return pinned
    if pinned is not None and pinned != chain:
        raise NetworkParamsError(
            f"{pin_name} disagrees with the protocol parameters the chain records ({rec.source()}): "
            + "; ".join(f"{d} (pinned != chain)" for d in pinned.differences(chain))
            + "; follow the chain's parameters (drop the pin) or fix it")
    return chain


def resolve_params(transport: Transport, pinned: ProtocolParams | None, *, upto: int,
                   authority: str | None = None, pin_name: str = "the pinned parameters",
                   since: int = 1) -> tuple[ProtocolParams, NetworkRecord]:
    """`read_network` then `check_pinned`: the parameters in effect at `upto`, and the record."""
    rec = read_network(transport, upto, authority=authority, since=since)
    return check_pinned(rec, pinned, pin_name=pin_name), rec


def seeded_state(rec: NetworkRecord, params: ProtocolParams) -> ProtocolState:
    """A fresh protocol state for a follower starting after `rec.at.upto` (else `rec.upto`): no
    runs yet, the network's authority and scheduled changes as of that block, so that it derives
    what a follower from genesis does of what comes after.

    Nothing before that block counts, verifier bonds included (protocol v2): committees are drawn
    from the bonds made after it, so a network that starts at a later block starts with no bonded
    verifiers, and every participant of it must start at the same block."""
    start = rec.at if rec.at is not None else rec
    return ProtocolState(
        params=params,
        authority=start.state.authority,
        configured_at=start.state.configured_at,
        schedule=copy.deepcopy(start.state.schedule),
    )


class BlockMemo:
    """A read-only view of a transport that keeps the blocks up to the head it saw when made (at
    most `limit`) until they are read a second time, so that reading the network record and then
    replaying the chain reads each block once. Later blocks pass through unkept."""

    def __init__(self, transport: Transport, limit: int = 20_000) -> None:
        self.transport = transport
        self.limit = limit
        self.until = transport.finalized_head()
        self._blocks: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def block(self, number: int) -> Any:
        b = self._blocks.pop(number, None)  # a block is wanted twice at most: the scan, then the replay
        if b is None:
            b = self.transport.block(number)
            if number <= self.until and len(self._blocks) < self.limit:
                self._blocks[number] = b
        return b


__all__ = [
    "BlockMemo",
    "NetworkParamsError",
    "NetworkRecord",
    "check_pinned",
    "network_authority",
    "read_network",
    "resolve_params",
    "seeded_state",
    "start_params",
]
