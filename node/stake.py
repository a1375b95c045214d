"""This node's verifier bond: the bond tx journal (so a restart never bonds twice for one gap),
the stake the chain records for the node's account, and its history (bonds, unbonding, releases,
penalties), all in the node database for the API and the dashboard.

Committees are drawn only from accounts whose active bond is at least the protocol's
verifier_stake, so the daemon keeps its bond at `[verifier] bond`: on start and after a reconnect,
once it has caught up with the chain, a lower bond is topped up with one BondVerifier call for the
difference. The call is journaled (node_meta BOND_TX_KEY) before it is sent; while it is pending
the node sends no other until `resend_blocks` blocks have passed without the chain showing it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from node.db import node_meta, stake_events

BOND_TX_KEY = "bond_tx"
STAKE_KEY = "stake"
STAKE_EVENTS = ("VerifierBonded", "VerifierUnbonding", "BondReleased", "VerifierPenalized")
RECENT_PENALTIES = 10


@dataclass(frozen=True)
class PendingBond:
    """A BondVerifier call this node sent (or was about to send) and the chain has not shown yet."""

    account: str
    amount: int
    target: int
    sent_block: int  # the finalized head when it was sent
    sent_at: float
    tx_hash: str | None = None
    error: str | None = None


def _get(conn: Connection, key: str) -> Any:
    raw = conn.execute(select(node_meta.c.value).where(node_meta.c.key == key)).scalar()
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _put(conn: Connection, key: str, value: Any) -> None:
    text = json.dumps(value, sort_keys=True)
    if conn.execute(update(node_meta).where(node_meta.c.key == key).values(value=text)).rowcount == 0:
        conn.execute(node_meta.insert().values(key=key, value=text))


def pending_bond(conn: Connection) -> PendingBond | None:
    d = _get(conn, BOND_TX_KEY)
    if not isinstance(d, dict):
        return None
    try:
        return PendingBond(**d)
    except TypeError:
        return None


def record_bond(conn: Connection, *, account: str, amount: int, target: int, head: int) -> PendingBond:
    """Journal a bond call before it leaves the node."""
    p = PendingBond(account, amount, target, head, time.time())
    _put(conn, BOND_TX_KEY, asdict(p))
    return p


def update_bond(conn: Connection, **values: Any) -> None:
    """Note the tx hash or the send error of the pending bond call."""
    p = pending_bond(conn)
    if p is not None:
        _put(conn, BOND_TX_KEY, {**asdict(p), **values})


def clear_bond(conn: Connection) -> None:
    conn.execute(node_meta.delete().where(node_meta.c.key == BOND_TX_KEY))


def record_event(conn: Connection, ev: Any) -> None:
    """One stake event of this node's account (VerifierBonded, VerifierUnbonding, BondReleased,
    VerifierPenalized) into stake_events."""
    conn.execute(stake_events.insert().values(
        block=ev.block, name=ev.code, verifier=ev.verifier, amount=ev.amount, bond=getattr(ev, "bond", None),
        release_block=getattr(ev, "release_block", None), challenge_id=getattr(ev, "challenge_id", None),
        why=getattr(ev, "why", None), created_at=time.time()))


def save_stake(conn: Connection, account: str, state: Any, *, target: int) -> None:
    """What the chain's state (a chain.protocol.ProtocolState) holds of `account`'s stake now."""
    _put(conn, STAKE_KEY, {
        "account": account, "block": state.head, "target": target,
        "verifier_stake": state.params.verifier_stake,
        "bond": int(state.vbonds.get(account, 0)),
        "unbonding": [{"release_block": int(r), "amount": int(a)} for r, a in state.unbonding.get(account, [])],
        "slashed": int(state.slashed.get(account, 0)),
        "updated_at": time.time(),
    })


def stake_status(conn: Connection, account: str | None) -> dict[str, Any]:
    """The stake panel: active bond, unbonding amounts with their release blocks, penalties (the
    total this node saw and the latest few, with their challenge and why), the pending bond call."""
    saved = _get(conn, STAKE_KEY)
    if not isinstance(saved, dict) or (account is not None and saved.get("account") != account):
        saved = {}
    who = account or saved.get("account")
    penalties: list[dict[str, Any]] = []
    totals = {"penalised": 0, "bonded": 0, "released": 0}
    if who:
        rows = conn.execute(select(stake_events.c.name, func.coalesce(func.sum(stake_events.c.amount), 0))
                            .where(stake_events.c.verifier == who).group_by(stake_events.c.name)).all()
        sums = {name: int(n) for name, n in rows}
        totals = {"penalised": sums.get("VerifierPenalized", 0), "bonded": sums.get("VerifierBonded", 0),
                  "released": sums.get("BondReleased", 0)}
        for r in conn.execute(select(stake_events).where(stake_events.c.verifier == who,
                                                         stake_events.c.name == "VerifierPenalized")
                              .order_by(stake_events.c.block.desc(), stake_events.c.id.desc())
                              .limit(RECENT_PENALTIES)):
            penalties.append({"block": r.block, "challenge_id": None if r.challenge_id is None else bytes(r.challenge_id).hex(),
                              "amount": r.amount, "why": r.why})
    pending = pending_bond(conn)
    unbonding = list(saved.get("unbonding") or [])
    bond = saved.get("bond")
    floor = saved.get("verifier_stake")
    return {
        "account": who, "block": saved.get("block"), "bond": bond, "target": saved.get("target"),
        "verifier_stake": floor,
        "eligible": None if bond is None or floor is None else bond >= floor,
        "unbonding": unbonding, "unbonding_total": sum(int(u["amount"]) for u in unbonding),
        "penalised_total": totals["penalised"], "bonded_total": totals["bonded"], "released_total": totals["released"],
        "penalties": penalties,
        "pending_bond": None if pending is None or pending.account != who else {
            "amount": pending.amount, "sent_block": pending.sent_block, "tx_hash": pending.tx_hash,
            "error": pending.error},
    }


__all__ = ["BOND_TX_KEY", "STAKE_EVENTS", "STAKE_KEY", "PendingBond", "clear_bond", "pending_bond", "record_bond",
           "record_event", "save_stake", "stake_status", "update_bond"]
