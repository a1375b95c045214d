"""Witness journal: one commitment per (challenge, verifier), ever; tx states move forward only."""

from __future__ import annotations

import os
import threading

import pytest
import sqlalchemy as sa

from chain.calls import CommitWitness, RevealWitnessValue, decode_call
from challenges.witness import verify_witness
from node.db import txs, witnesses
from node.journal import (
    JournalError,
    check_and_insert_witness,
    confirm_tx,
    fail_tx,
    get_tx,
    get_witness,
    list_txs,
    mark_in_progress,
    mark_unconfirmed,
)

CID = bytes(range(32))
PROOF = b"\x77" * 32


def journal(engine, value: bytes, *, salt: bytes | None = None, bucket: int = 0, cid: bytes = CID,
            verifier: str = "v1", proof: bytes = PROOF):
    return check_and_insert_witness(engine, challenge_id=cid, verifier=verifier, value_hash=value,
                                    norm_bucket=bucket, salt=salt or os.urandom(32), proof_hash=proof)


def test_one_transaction_stores_salt_value_commitment_and_both_payloads(engine):
    entry, inserted = journal(engine, b"\x11" * 32, bucket=7)
    assert inserted and entry.proof_hash == PROOF
    assert verify_witness(entry.commitment, CID, b"\x11" * 32, 7, entry.salt, "v1", proof_hash=PROOF)
    assert not verify_witness(
        entry.commitment, CID, b"\x11" * 32, 7, entry.salt, "v1", proof_hash=b"\x78" * 32
    )
    commit, reveal = get_tx(engine, CID, "v1", "commit"), get_tx(engine, CID, "v1", "reveal")
    assert commit.state == reveal.state == "unstarted"
    assert decode_call(commit.payload) == CommitWitness(CID, entry.commitment)
    assert decode_call(reveal.payload) == RevealWitnessValue(CID, b"\x11" * 32, PROOF, 7, entry.salt)
    assert commit.origin == "v1"
    assert get_witness(engine, CID, "v1") == entry


def test_second_different_commitment_is_impossible(engine):
    first, _ = journal(engine, b"\x11" * 32)
    again, inserted = journal(engine, b"\x22" * 32)
    assert not inserted and again == first
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
        c.execute(witnesses.insert().values(challenge_id=CID, verifier="v1", salt=os.urandom(32),
                                            value_hash=b"\x22" * 32, norm_bucket=0, commitment=b"\x33" * 32,
                                            created_at=0.0))
    with engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(witnesses)).scalar() == 1
        assert c.execute(sa.select(sa.func.count()).select_from(txs)).scalar() == 2


def test_other_verifiers_and_challenges_are_independent(engine):
    a, _ = journal(engine, b"\x11" * 32)
    b, ins_b = journal(engine, b"\x11" * 32, verifier="v2")
    c, ins_c = journal(engine, b"\x11" * 32, cid=b"\x01" * 32)
    assert ins_b and ins_c and len({a.commitment, b.commitment, c.commitment}) == 3


def test_ten_concurrent_attempts_exactly_one_wins(engine):
    results, errors = [], []
    barrier = threading.Barrier(10)

    def attempt(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results.append(journal(engine, bytes([i]) * 32))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(inserted for _, inserted in results) == 1
    winners = {entry.commitment for entry, _ in results}
    assert len(winners) == 1
    stored = get_witness(engine, CID, "v1")
    assert stored.commitment in winners
    assert len(list_txs(engine)) == 2


def test_tx_states_move_forward_only(engine):
    journal(engine, b"\x11" * 32)
    tx = get_tx(engine, CID, "v1", "commit")
    mark_in_progress(engine, tx.id, head=5)
    mark_unconfirmed(engine, tx.id, b"\xaa" * 32)
    tx = get_tx(engine, CID, "v1", "commit")
    assert (tx.state, tx.sends, tx.sent_block, tx.tx_hash) == ("unconfirmed", 1, 5, b"\xaa" * 32)
    mark_in_progress(engine, tx.id, head=9)  # a resend after a restart: same bytes, one more send
    assert get_tx(engine, CID, "v1", "commit").sends == 2
    with engine.begin() as c:
        assert confirm_tx(c, CID, "v1", "commit", 10)
    with pytest.raises(JournalError, match="already final"):
        mark_in_progress(engine, tx.id, head=11)
    with engine.begin() as c:
        assert not fail_tx(c, CID, "v1", "commit", "too late")
    assert get_tx(engine, CID, "v1", "commit").state == "confirmed"


def test_failed_tx_keeps_its_reason(engine):
    journal(engine, b"\x11" * 32)
    with engine.begin() as c:
        assert fail_tx(c, CID, "v1", "reveal", "RevealTooLate: window closed")
    tx = get_tx(engine, CID, "v1", "reveal")
    assert tx.state == "failed" and "RevealTooLate" in tx.last_error


def _conflicts(engine):
    from node.db import witness_conflicts

    with engine.connect() as c:
        return c.execute(sa.select(witness_conflicts).order_by(witness_conflicts.c.id)).all()


def test_same_value_repeat_is_a_silent_no_op(engine, caplog):
    first, _ = journal(engine, b"\x11" * 32, bucket=4)
    with caplog.at_level("WARNING", logger="node.journal"):
        again, inserted = journal(engine, b"\x11" * 32, bucket=4)  # another salt: not part of the value
    assert not inserted and again == first
    assert _conflicts(engine) == [] and caplog.records == []


@pytest.mark.parametrize(("value", "bucket", "proof"), [(b"\x22" * 32, 4, PROOF), (b"\x11" * 32, 5, PROOF),
                                                      (b"\x11" * 32, 4, b"\x78" * 32)])
def test_different_value_repeat_is_recorded_and_alarmed(engine, caplog, value, bucket, proof):
    first, _ = journal(engine, b"\x11" * 32, bucket=4)
    with caplog.at_level("WARNING", logger="node.journal"):
        again, inserted = journal(engine, value, bucket=bucket, proof=proof)
    # Nothing different is sent: the journaled entry and its two txs stay the only ones.
    assert not inserted and again == first
    assert decode_call(get_tx(engine, CID, "v1", "reveal").payload) == RevealWitnessValue(
        CID, b"\x11" * 32, PROOF, 4, first.salt
    )
    with engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(txs)).scalar() == 2
    [row] = _conflicts(engine)
    assert (bytes(row.challenge_id), row.verifier) == (CID, "v1")
    assert (bytes(row.journaled_value_hash), row.journaled_norm_bucket) == (b"\x11" * 32, 4)
    assert (bytes(row.recomputed_value_hash), row.recomputed_norm_bucket) == (value, bucket)
    assert (bytes(row.journaled_proof_hash), bytes(row.recomputed_proof_hash)) == (PROOF, proof)
    assert row.acknowledged_at is None
    [rec] = caplog.records
    assert rec.levelname == "ERROR" and rec.event == "witness_conflict"
    assert rec.challenge_id == CID.hex()
    assert rec.journaled_value_hash == (b"\x11" * 32).hex() and rec.journaled_norm_bucket == 4
    assert rec.recomputed_value_hash == value.hex() and rec.recomputed_norm_bucket == bucket
    # Each further differing repeat is one more conflict; a same-value one still is none.
    journal(engine, value, bucket=bucket, proof=proof)
    journal(engine, b"\x11" * 32, bucket=4)
    assert len(_conflicts(engine)) == 2
