"""The witness journal: salt, value, commitment and the exact tx bytes, made durable before sending.

Like a slashing-protection database, the decision "may I commit this?" is one transaction that
happens before anything leaves the node; UNIQUE (challenge_id, verifier) makes a second, different
commitment impossible. Txs then move unstarted -> in_progress -> unconfirmed -> confirmed. An
escalation (protocol v3) is journaled the same way, once per round: a tx of kind "escalate".

Protocol v2 witnesses are pairs: the value hash H(recomputed leaf t) and the proof hash of the
recomputed post-state; both enter the commitment and the reveal.

A repeat with the same value is a silent no-op. A repeat with a different value (value hash, proof
hash or norm bucket) still gets the journaled entry back, so nothing different is ever sent, but it is a
determinism failure: it is recorded in witness_conflicts and logged at error level.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from chain.calls import CommitWitness, EscalateChallenge, RevealWitnessValue, encode_call
from challenges.witness import witness_commitment
from node.db import txs, witness_conflicts, witnesses
from node.logs import log_event

log = logging.getLogger("node.journal")


class JournalError(RuntimeError):
    """A journal transition that would break its invariants, with the reason."""


@dataclass(frozen=True)
class WitnessEntry:
    challenge_id: bytes
    verifier: str
    salt: bytes
    value_hash: bytes
    norm_bucket: int
    commitment: bytes
    created_at: float
    proof_hash: bytes | None = None  # None: an entry journaled before protocol v2


@dataclass(frozen=True)
class TxRecord:
    id: int
    challenge_id: bytes
    verifier: str
    kind: str
    origin: str
    payload: bytes
    state: str
    tx_hash: bytes | None
    sent_block: int | None
    block: int | None
    sends: int
    last_error: str | None


def _entry(row) -> WitnessEntry:
    return WitnessEntry(bytes(row.challenge_id), row.verifier, bytes(row.salt), bytes(row.value_hash),
                        row.norm_bucket, bytes(row.commitment), row.created_at,
                        None if row.proof_hash is None else bytes(row.proof_hash))


def _tx(row) -> TxRecord:
    return TxRecord(row.id, bytes(row.challenge_id), row.verifier, row.kind, row.origin, bytes(row.payload),
                    row.state, bytes(row.tx_hash) if row.tx_hash is not None else None, row.sent_block,
                    row.block, row.sends, row.last_error)


def _existing(conn: Connection, challenge_id: bytes, verifier: str) -> WitnessEntry | None:
    row = conn.execute(select(witnesses).where(
        and_(witnesses.c.challenge_id == challenge_id, witnesses.c.verifier == verifier))).first()
    return _entry(row) if row is not None else None


def differs(
    entry: WitnessEntry, value_hash: bytes, norm_bucket: int, proof_hash: bytes | None = None
) -> bool:
    """Whether a recomputed witness disagrees with the journaled one (the salt is not the value).
    `proof_hash` None compares the value and bucket only."""
    return (entry.value_hash != bytes(value_hash) or entry.norm_bucket != norm_bucket
            or (proof_hash is not None and entry.proof_hash != bytes(proof_hash)))


def _hex(b: bytes | None) -> str | None:
    return None if b is None else bytes(b).hex()


def _record_conflict(conn: Connection, found: WitnessEntry, value_hash: bytes, norm_bucket: int,
                     proof_hash: bytes | None) -> None:
    conn.execute(witness_conflicts.insert().values(
        challenge_id=found.challenge_id, verifier=found.verifier, journaled_value_hash=found.value_hash,
        journaled_norm_bucket=found.norm_bucket, recomputed_value_hash=bytes(value_hash),
        recomputed_norm_bucket=norm_bucket, created_at=time.time(), journaled_proof_hash=found.proof_hash,
        recomputed_proof_hash=None if proof_hash is None else bytes(proof_hash)))


def _alarm(found: WitnessEntry, value_hash: bytes, norm_bucket: int, proof_hash: bytes | None) -> None:
    log_event(log, "witness_conflict", level=logging.ERROR, challenge_id=found.challenge_id.hex(),
              verifier=found.verifier, journaled_value_hash=found.value_hash.hex(),
              journaled_norm_bucket=found.norm_bucket, recomputed_value_hash=bytes(value_hash).hex(),
              recomputed_norm_bucket=norm_bucket, journaled_proof_hash=_hex(found.proof_hash),
              recomputed_proof_hash=_hex(proof_hash),
              detail="the recomputed witness differs from the journaled one; the journaled one stays "
                     "the only one sent. A replay that changed its answer is a determinism failure.")


def check_and_insert_witness(engine: Engine, *, challenge_id: bytes, verifier: str, value_hash: bytes,
                             norm_bucket: int, salt: bytes, proof_hash: bytes,
                             origin: str | None = None) -> tuple[WitnessEntry, bool]:
    """Journal a witness pair (value hash, proof hash) for (challenge, verifier), or return the one
    already journaled.

    One transaction stores the salt, the pair, the bucket, the commitment
    (challenges.witness.witness_commitment) and both tx payloads (commit and reveal, `unstarted`). Returns
    (entry, inserted); when not inserted, the caller must use the returned entry, never its own values: that
    is the only commitment this verifier will ever send. A repeat whose value differs from the journaled one
    is recorded in witness_conflicts (in the same transaction as the look-up) and logged at error level.
    """
    commitment = witness_commitment(
        challenge_id, value_hash, norm_bucket, salt, verifier, proof_hash=proof_hash
    )
    commit_bytes = encode_call(CommitWitness(challenge_id, commitment))
    reveal_bytes = encode_call(RevealWitnessValue(challenge_id, value_hash, proof_hash, norm_bucket, salt))
    now = time.time()
    origin = origin or verifier
    try:
        with engine.begin() as conn:
            found = _existing(conn, challenge_id, verifier)
            if found is None:
                conn.execute(witnesses.insert().values(
                    challenge_id=challenge_id, verifier=verifier, salt=salt, value_hash=value_hash,
                    norm_bucket=norm_bucket, commitment=commitment, created_at=now, proof_hash=proof_hash))
                conn.execute(
                    txs.insert(),
                    [
                        dict(
                            challenge_id=challenge_id,
                            verifier=verifier,
                            kind=kind,
                            origin=origin,
                            payload=payload,
                            state="unstarted",
                            sends=0,
                            created_at=now,
                            updated_at=now,
                        )
                        for kind, payload in (("commit", commit_bytes), ("reveal", reveal_bytes))
                    ],
                )
            elif differs(found, value_hash, norm_bucket, proof_hash):
                _record_conflict(conn, found, value_hash, norm_bucket, proof_hash)
    except IntegrityError:
        # A concurrent writer won the race between our look-up and insert: its entry stands.
        with engine.begin() as conn:
            found = _existing(conn, challenge_id, verifier)
            if found is None:
                raise
            if differs(found, value_hash, norm_bucket, proof_hash):
                _record_conflict(conn, found, value_hash, norm_bucket, proof_hash)
    if found is not None:
        if differs(found, value_hash, norm_bucket, proof_hash):
            _alarm(found, value_hash, norm_bucket, proof_hash)
        return found, False
    return WitnessEntry(challenge_id, verifier, salt, value_hash, norm_bucket, commitment, now,
                        bytes(proof_hash)), True


def journal_escalation(conn: Connection, *, challenge_id: bytes, verifier: str,
                       origin: str | None = None) -> tuple[TxRecord, bool]:
    """Journal this verifier's escalate_challenge call for a round (protocol v3), in the caller's
    transaction, before it leaves the node: a tx of kind "escalate", `unstarted`. The UNIQUE
    (challenge_id, verifier, kind) makes it the only one: a repeat returns the one journaled.
    Returns (tx, inserted)."""
    found = get_tx(conn, challenge_id, verifier, "escalate")
    if found is not None:
        return found, False
    now = time.time()
    conn.execute(txs.insert().values(
        challenge_id=challenge_id, verifier=verifier, kind="escalate", origin=origin or verifier,
        payload=encode_call(EscalateChallenge(challenge_id)), state="unstarted", sends=0, created_at=now,
        updated_at=now))
    tx = get_tx(conn, challenge_id, verifier, "escalate")
    assert tx is not None
    return tx, True


def get_witness(engine: Engine, challenge_id: bytes, verifier: str) -> WitnessEntry | None:
    with engine.connect() as conn:
        return _existing(conn, challenge_id, verifier)


def get_tx(
    engine_or_conn: Engine | Connection, challenge_id: bytes, verifier: str, kind: str
) -> TxRecord | None:
    q = select(txs).where(and_(txs.c.challenge_id == challenge_id, txs.c.verifier == verifier,
                               txs.c.kind == kind))
    if isinstance(engine_or_conn, Engine):
        with engine_or_conn.connect() as conn:
            row = conn.execute(q).first()
    else:
        row = engine_or_conn.execute(q).first()
    return _tx(row) if row is not None else None


def list_txs(engine: Engine, *, states: tuple[str, ...] | None = None) -> list[TxRecord]:
    q = select(txs).order_by(txs.c.id)
    if states:
        q = q.where(txs.c.state.in_(states))
    with engine.connect() as conn:
        return [_tx(r) for r in conn.execute(q)]


_ALLOWED = {
    "in_progress": ("unstarted", "in_progress", "unconfirmed"),
    "unconfirmed": ("in_progress", "unconfirmed"),
    "confirmed": ("unstarted", "in_progress", "unconfirmed", "confirmed"),
    "failed": ("unstarted", "in_progress", "unconfirmed"),
}


def set_tx_state(conn: Connection, tx_id: int, state: str, **values) -> bool:
    """Move a tx to `state` if the transition is allowed; False when it was not (already final)."""
    allowed = _ALLOWED.get(state)
    if allowed is None:
        raise JournalError(f"unknown tx state {state!r}")
    res = conn.execute(update(txs).where(and_(txs.c.id == tx_id, txs.c.state.in_(allowed)))
                       .values(state=state, updated_at=time.time(), **values))
    return res.rowcount == 1


def mark_in_progress(engine: Engine, tx_id: int, head: int) -> None:
    """Persisted before the bytes go out: a crash after this line means "maybe sent"."""
    with engine.begin() as conn:
        if not set_tx_state(conn, tx_id, "in_progress", sent_block=head, sends=txs.c.sends + 1):
            raise JournalError(f"tx {tx_id} is already final; not sending it again")


def mark_unconfirmed(engine: Engine, tx_id: int, tx_hash: bytes | None) -> None:
    with engine.begin() as conn:
        set_tx_state(conn, tx_id, "unconfirmed", tx_hash=tx_hash, last_error=None)


def mark_send_error(engine: Engine, tx_id: int, error: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(txs).where(txs.c.id == tx_id).values(last_error=error[:2000], updated_at=time.time())
        )


def confirm_tx(conn: Connection, challenge_id: bytes, verifier: str, kind: str, block: int) -> bool:
    """The chain included our call (seen in a finalized block): final success."""
    row = get_tx(conn, challenge_id, verifier, kind)
    if row is None:
        return False
    return set_tx_state(conn, row.id, "confirmed", block=block)


def fail_tx(conn: Connection, challenge_id: bytes, verifier: str, kind: str, reason: str) -> bool:
    row = get_tx(conn, challenge_id, verifier, kind)
    if row is None:
        return False
    return set_tx_state(conn, row.id, "failed", last_error=reason[:2000])


__all__ = [
    "JournalError",
    "TxRecord",
    "WitnessEntry",
    "check_and_insert_witness",
    "confirm_tx",
    "differs",
    "fail_tx",
    "get_tx",
    "get_witness",
    "journal_escalation",
    "list_txs",
    "mark_in_progress",
    "mark_send_error",
    "mark_unconfirmed",
    "set_tx_state",
]
