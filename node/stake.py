"""This node's verifier bond: the bond tx journal (so a restart never bonds twice for one gap),
the stake the chain records for the node's account, and its history (bonds, unbonding, releases,
penalties, and since protocol v3 the fees paid to it and its escalations), all in the node
database for the API and the dashboard.

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
STAKE_EVENTS = ("VerifierBonded", "VerifierUnbonding", "BondReleased", "VerifierPenalized", "VerifierPaid",
                "ChallengeEscalated", "EscalationSettled")
RECENT_PENALTIES = 10
RECENT_PAYMENTS = 10
# VerifierPaid's `why`: a winning seat's fee, a share of a miner's slash, a share of forfeited escalations.
PAYMENT_KINDS = ("seat_fee", "slash_share", "dispute_pool")


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
    """One stake event of this node's account (a code of STAKE_EVENTS) into stake_events: an
    escalation's row holds the stake it reserved, a settlement's the stake returned or forfeited
    (its `why`)."""
    if ev.code == "ChallengeEscalated":
        amount, why = ev.stake, None
    elif ev.code == "EscalationSettled":
        amount, why = (ev.forfeited, "forfeited") if ev.forfeited else (ev.returned, "returned")
    else:
        amount, why = ev.amount, getattr(ev, "why", None)
    conn.execute(stake_events.insert().values(
        block=ev.block, name=ev.code, verifier=ev.verifier, amount=amount, bond=getattr(ev, "bond", None),
        release_block=getattr(ev, "release_block", None), challenge_id=getattr(ev, "challenge_id", None),
        why=why, created_at=time.time()))


def save_stake(conn: Connection, account: str, state: Any, *, target: int) -> None:
    """What the chain's state (a chain.protocol.ProtocolState) holds of `account`'s stake now."""
    _put(
        conn,
        STAKE_KEY,
        {
            "account": account,
            "block": state.head,
            "target": target,
            "verifier_stake": state.params.verifier_stake,
            "bond": int(state.vbonds.get(account, 0)),
            # Protocol v3: what the account's seats and escalations reserve of it, the chain's running
            # total of what was credited to it, and what one escalation reserves.
            "reserved": int(state.reserved.get(account, 0)),
            "paid": int(state.paid.get(account, 0)),
            "escalation_stake": state.params.escalation_stake,
            "unbonding": [
                {"release_block": int(r), "amount": int(a)} for r, a in state.unbonding.get(account, [])
            ],
            "slashed": int(state.slashed.get(account, 0)),
            "updated_at": time.time(),
        },
    )


def _recent(conn: Connection, who: str, name: str, limit: int) -> list[dict[str, Any]]:
    """The latest `limit` stake events `name` of `who`, newest first."""
    return [
        {
            "block": r.block,
            "challenge_id": None if r.challenge_id is None else bytes(r.challenge_id).hex(),
            "amount": r.amount,
            "why": r.why,
        }
        for r in conn.execute(
            select(stake_events)
            .where(stake_events.c.verifier == who, stake_events.c.name == name)
            .order_by(stake_events.c.block.desc(), stake_events.c.id.desc())
            .limit(limit)
        )
    ]


def stake_status(conn: Connection, account: str | None) -> dict[str, Any]:
    """The stake panel: active bond, what of it seats and escalations reserve and what is free,
    unbonding amounts with their release blocks, penalties and fees (the totals this node saw and
    the latest few, with their challenge and why), escalation stakes forfeited, the pending bond call."""
    saved = _get(conn, STAKE_KEY)
    if not isinstance(saved, dict) or (account is not None and saved.get("account") != account):
        saved = {}
    who = account or saved.get("account")
    penalties: list[dict[str, Any]] = []
    payments: list[dict[str, Any]] = []
    sums: dict[tuple[str, str | None], int] = {}
    if who:
        rows = conn.execute(select(stake_events.c.name, stake_events.c.why,
                                   func.coalesce(func.sum(stake_events.c.amount), 0))
                            .where(stake_events.c.verifier == who)
                            .group_by(stake_events.c.name, stake_events.c.why)).all()
        sums = {(name, why): int(n) for name, why, n in rows}
        penalties = _recent(conn, who, "VerifierPenalized", RECENT_PENALTIES)
        payments = _recent(conn, who, "VerifierPaid", RECENT_PAYMENTS)

    def total(name: str, why: str | None = None) -> int:
        return sum(n for (k, w), n in sums.items() if k == name and (why is None or w == why))

    pending = pending_bond(conn)
    unbonding = list(saved.get("unbonding") or [])
    bond = saved.get("bond")
    floor = saved.get("verifier_stake")
    reserved = saved.get("reserved", 0 if bond is not None else None)
    free = None if bond is None else bond - int(reserved or 0)
    return {
        "account": who, "block": saved.get("block"), "bond": bond, "target": saved.get("target"),
        "verifier_stake": floor,
        # A seat reserves verifier_stake of FREE bond: an account is drawn only while that much is free.
        "eligible": None if free is None or floor is None else free >= floor,
        "reserved": reserved, "free": free,
        "unbonding": unbonding, "unbonding_total": sum(int(u["amount"]) for u in unbonding),
        "penalised_total": total("VerifierPenalized"), "bonded_total": total("VerifierBonded"),
        "released_total": total("BondReleased"),
        "penalties": penalties,
        "paid_total": total("VerifierPaid"),
        "paid_by_why": {why: total("VerifierPaid", why) for why in PAYMENT_KINDS},
        "payments": payments,
        "escalation_stake": saved.get("escalation_stake"),
        "escalated_total": total("ChallengeEscalated"),
        "forfeited_total": total("EscalationSettled", "forfeited"),
        "pending_bond": None if pending is None or pending.account != who else {
            "amount": pending.amount, "sent_block": pending.sent_block, "tx_hash": pending.tx_hash,
            "error": pending.error},
    }


__all__ = [
    "BOND_TX_KEY",
    "PAYMENT_KINDS",
    "STAKE_EVENTS",
    "STAKE_KEY",
    "PendingBond",
    "clear_bond",
    "pending_bond",
    "record_bond",
    "record_event",
    "save_stake",
    "stake_status",
    "update_bond",
]
