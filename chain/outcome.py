"""What became of a submission: submit calls, wait for the block that includes them, and read from
the chain's derived state what the protocol made of each call there (its effect, or the
`CallRefused` it recorded), so a caller can say it in words and fail on a refusal.

A chain includes a transaction whatever its calls hold; only applying the block says whether the
protocol accepted them. Every participant derives that the same way (`chain.view.ChainView`), so
the outcome read here is the one every node records, and the one `/api/v1/refusals` shows.

The calls of one transaction are matched to the block's events in order, by their sender and
name: a refusal names its call (`CallRefused.call`) and sender; an accepted call is known by the
event it leaves (`EFFECTS`, with the same run or challenge id). Two transactions of one account
that carry calls of the same name in the same block are told apart by their order only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chain.network import NetworkParamsError, read_network, seeded_state, start_params
from chain.protocol.events import CallRefused, Event
from chain.protocol.params import ProtocolParams
from chain.transport import Receipt, Transport, TransportError
from chain.view import ChainView

# The events an accepted call of each name leaves in its block (codes, chain.protocol.events).
EFFECTS: dict[str, tuple[str, ...]] = {
    "start_training_commitment": ("RunRegistered",),
    "submit_checkpoint_root": ("CheckpointRootUpdated",),
    "submit_opening": ("OpeningSubmitted",),
    "declare_witness_norm_bucket": ("NormBucketDeclared",),
    "commit_witness": ("WitnessCommitted",),
    "reveal_witness_value": ("WitnessRevealed",),
    "bond_verifier": ("VerifierBonded",),
    "unbond_verifier": ("VerifierUnbonding",),
    "configure_network": ("NetworkConfigured",),
}
_SUBJECTS = ("verifier", "miner", "authority", "origin")  # event fields that name the sender
_KEYS = ("run_id", "challenge_id")  # call fields an effect repeats


class OutcomeError(TransportError):
    """The outcome of a submission cannot be read: not included in time, or the view is past it."""


@dataclass(frozen=True)
class CallOutcome:
    """One call of a transaction: accepted (with the events it left) or refused."""

    call: str  # the call's NAME
    block: int
    refusal: CallRefused | None = None
    events: tuple[Event, ...] = ()

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def words(self) -> str:
        if self.refusal is not None:
            r = self.refusal
            return f"{self.call} refused in block {self.block}: {r.refusal}: {r.reason}"
        if not self.events:
            return f"{self.call} accepted in block {self.block} (no change: the chain holds it already)"
        return f"{self.call} accepted in block {self.block}: " + "; ".join(describe(e) for e in self.events)

    def as_json(self) -> dict[str, Any]:
        return {"call": self.call, "block": self.block, "ok": self.ok,
                "refusal": None if self.refusal is None else self.refusal.refusal,
                "reason": None if self.refusal is None else self.refusal.reason,
                "events": [e.to_dict() for e in self.events], "words": self.words()}


@dataclass(frozen=True)
class Outcome:
    """A transaction's receipt and what became of each of its calls, in order."""

    receipt: Receipt
    block: int
    calls: tuple[CallOutcome, ...]
    # Every event the view derived while reading the outcome (callers that follow the chain keep them).
    synced: tuple[Event, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.calls)

    @property
    def refusals(self) -> list[CallRefused]:
        return [c.refusal for c in self.calls if c.refusal is not None]

    def words(self) -> str:
        return "\n".join(c.words() for c in self.calls)

    def as_json(self) -> dict[str, Any]:
        return {"block": self.block, "tx_hash": self.receipt.tx_hash.hex(), "ok": self.ok,
                "calls": [c.as_json() for c in self.calls]}


def describe(ev: Event) -> str:
    """One event in words (the fields an operator acts on)."""
    d = ev.to_dict()
    code = d.pop("event")
    d.pop("block", None)
    if code == "VerifierUnbonding":
        return (f"{d['amount']} unbonding, released at block {d['release_block']}; "
                f"the active bond of {d['verifier']} is now {d['bond']}")
    if code == "VerifierBonded":
        return f"{d['verifier']} bonded {d['amount']}; its active bond is now {d['bond']}"
    if code == "RunRegistered":
        return (
            f"run {d['run_id'][:16]} registered by {d['miner']} "
            f"({d['declared_steps']} steps, stake {d['stake']})"
        )
    if code == "CheckpointRootUpdated":
        done = f", complete: challenges at block {d['challenges_at']}" if d["complete"] else ""
        return f"run {d['run_id'][:16]} root {d['root'][:16]} of size {d['size']}{done}"
    if code == "OpeningSubmitted":
        return f"challenge {d['challenge_id'][:16]} opened at step {d['step']} ({d['opening_digest'][:16]})"
    if code == "NetworkConfigured":
        return (f"parameters {d['params_digest'][:16]} of authority {d['authority']} take effect at block "
                f"{d['effective_block']}")
    rest = ", ".join(f"{k}={_short(v)}" for k, v in d.items())
    return f"{code} {rest}".strip()


def _short(v: Any) -> str:
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return v[:16]
    return str(v)


def follower_view(transport: Transport, *, start_block: int = 0, authority: str | None = None,
                  pinned: ProtocolParams | None = None, pin_name: str = "the pinned parameters") -> ChainView:
    """A fresh view of the chain as a participant following it from `start_block` derives it (the
    network's parameters checked against a pin, the state seeded at that block, as a node's is)."""
    head = transport.finalized_head()
    try:
        rec = read_network(transport, head, authority=authority, at=min(start_block, head))
        params = start_params(rec, pinned, pin_name=pin_name)
    except NetworkParamsError as exc:
        raise OutcomeError(str(exc)) from None
    return ChainView(
        transport, params, cursor=start_block, state=seeded_state(rec, params), keep_events=False
    )


def submit_and_read(
    transport: Transport,
    calls: list[Any],
    view: ChainView,
    *,
    timeout: float = 60.0,
    poll: float = 0.2,
    submit: Callable[[list[Any], float], Receipt] | None = None,
) -> Outcome:
    """Submit `calls` in one transaction, wait (up to `timeout` seconds in all) for the finalized
    block that includes it, apply the chain up to that block with `view`, and return what became
    of each call. Raises TransportError when the transaction is not included (OutcomeError when
    its block is not finalized in time); a refusal is an outcome, not an exception.

    `submit(calls, timeout)` replaces `transport.submit` (a caller's retries around it)."""
    if not calls:
        raise ValueError("submit_and_read needs at least one call")
    if not timeout > 0:
        raise ValueError(f"the timeout must be a positive number of seconds, got {timeout}")
    deadline = time.monotonic() + timeout
    receipt = (submit(calls, timeout) if submit is not None
               else transport.submit(calls, wait=True, timeout=timeout))
    n = receipt.block_number
    if n is None:
        raise OutcomeError(f"transaction 0x{receipt.tx_hash.hex()} was sent, but the chain named no block "
                           f"that includes it")
    while transport.finalized_head() < n:
        if time.monotonic() > deadline:
            raise OutcomeError(f"block {n}, which includes transaction 0x{receipt.tx_hash.hex()}, is not "
                               f"finalized after {timeout:g} s")
        time.sleep(poll)
    synced: list[Event] = []
    if view.cursor < n:
        synced = view.sync(until=n)
        events = [e for e in synced if e.block == n]
    elif view.keep_events:
        events = [e for e in view.events if e.block == n]
    else:
        raise OutcomeError(f"the chain view has applied block {n} of the transaction already (it is at block "
                           f"{view.cursor}) and keeps no events to read its outcome from")
    return Outcome(receipt, n, tuple(match(calls, transport.account, n, events)), tuple(synced))


def match(calls: list[Any], origin: str, block: int, events: list[Event]) -> list[CallOutcome]:
    """Each call's outcome among the events of its block, in order (see the module's docstring):
    a block's calls leave their events in the order the chain applied them, so each call takes
    the first of its refusal or its effect after the previous call's."""
    out = []
    at = 0
    for call in calls:
        name = getattr(call, "NAME", type(call).__name__)
        found = None
        for i in range(at, len(events)):
            e = events[i]
            if isinstance(e, CallRefused) and e.origin == origin and e.call == name:
                found = i, CallOutcome(name, block, refusal=e)
                break
            if e.code in EFFECTS.get(name, ()) and _concerns(e, call, origin):
                found = i, CallOutcome(name, block, events=(e,))
                break
        if found is None:  # accepted with no effect (an identical registration repeated)
            out.append(CallOutcome(name, block))
            continue
        at = found[0] + 1
        out.append(found[1])
    return out


def _concerns(ev: Event, call: Any, origin: str) -> bool:
    for key in _KEYS:
        if hasattr(call, key) and hasattr(ev, key) and getattr(call, key) != getattr(ev, key):
            return False
    subjects = [getattr(ev, f) for f in _SUBJECTS if hasattr(ev, f)]
    return not subjects or origin in subjects


__all__ = ["EFFECTS", "CallOutcome", "Outcome", "OutcomeError", "describe", "follower_view", "match",
           "submit_and_read"]
