"""The node database holds every number the protocol derives: block numbers and deadlines past
2^31, bonds and penalties up to MAX_BOND, opening sizes past 2 GiB (64-bit columns, revision
0004; a round's escalation deadline, revision 0005), on SQLite and on PostgreSQL; a 0003 database
migrates keeping its rows and their links, a 0004 one gains the escalation columns empty."""

from __future__ import annotations

import sqlalchemy as sa

from chain.protocol.params import MAX_BLOCK, MAX_BOND, MAX_DEADLINE_SPAN
from node.db import (
    SCHEMA_NAME,
    _alembic_config,
    chain_cursor,
    challenges,
    current_revision,
    head_revision,
    make_engine,
    migrate,
    node_meta,
    open_database,
    runs,
    stage_log,
    stake_events,
    txs,
)

BOND = 1 << 40
LAST_DEADLINE = MAX_BLOCK + MAX_DEADLINE_SPAN - 1  # the latest deadline a challenge can have
ABOVE_31 = (1 << 31) + 7


def _run(run_id: bytes, block: int) -> dict:
    return dict(
        run_id=run_id,
        miner="m",
        spec_digest=bytes(32),
        mode="value",
        declared_steps=8,
        endpoint="http://m",
        initial_hash=bytes(32),
        schedule_commitment=bytes(32),
        dataset_hash=bytes(32),
        registered_block=block,
        slashed=MAX_BOND,
    )


def _challenge(cid: bytes, run_id: bytes, issued: int, deadline: int) -> dict:
    return dict(
        challenge_id=cid,
        run_id=run_id,
        idx=0,
        step=1,
        root=bytes(32),
        size=9,
        mode="value",
        endpoint="http://m",
        issued_block=issued,
        opening_deadline=deadline - 2,
        commit_deadline=deadline - 1,
        reveal_deadline=deadline,
        escalate_deadline=deadline + 2,
        stage="resolved",
        opening_block=issued + 1,
        opening_bytes=5 << 30,
        replay_loss_bits=0xC0490FDB,
        resolved_block=deadline + 1,
        miner_slashed=MAX_BOND,
        penalty=BOND,
        created_at=1.0,
        updated_at=1.0,
    )


def _before_v3(row: dict) -> dict:
    """A challenge row as a database before revision 0005 holds it."""
    return {k: v for k, v in row.items() if k not in ("escalate_deadline", "escalation")}


def test_bonds_past_2_to_the_40_and_deadlines_past_2_to_the_31_are_stored_and_read_back(engine):
    with engine.begin() as c:
        c.execute(chain_cursor.insert().values(id=1, block=LAST_DEADLINE, block_hash=bytes(32), snapshot=b"s",
                                               updated_at=1.0))
        c.execute(runs.insert().values(**_run(b"\x01" * 32, ABOVE_31)))
        c.execute(
            challenges.insert().values(**_challenge(b"\x02" * 32, b"\x01" * 32, ABOVE_31, ABOVE_31 + 10))
        )
        c.execute(
            challenges.insert().values(**_challenge(b"\x03" * 32, b"\x01" * 32, MAX_BLOCK, LAST_DEADLINE - 1))
        )
        c.execute(
            stake_events.insert().values(
                block=ABOVE_31,
                name="VerifierBonded",
                verifier="v1",
                amount=BOND,
                bond=MAX_BOND,
                created_at=1.0,
            )
        )
        c.execute(
            stake_events.insert().values(
                block=MAX_BLOCK,
                name="VerifierUnbonding",
                verifier="v1",
                amount=BOND,
                bond=MAX_BOND - BOND,
                release_block=LAST_DEADLINE,
                created_at=1.0,
            )
        )
        c.execute(txs.insert().values(challenge_id=b"\x02" * 32, verifier="v1", kind="commit", origin="v1",
                                      payload=b"p", state="confirmed", sent_block=LAST_DEADLINE - 3,
                                      block=LAST_DEADLINE - 2, created_at=1.0, updated_at=1.0))
    with engine.connect() as c:
        assert c.execute(sa.select(chain_cursor.c.block)).scalar() == LAST_DEADLINE
        assert c.execute(sa.select(runs.c.registered_block, runs.c.slashed)).one() == (ABOVE_31, MAX_BOND)
        rows = c.execute(sa.select(challenges).order_by(challenges.c.issued_block)).all()
        assert [(r.issued_block, r.reveal_deadline, r.resolved_block) for r in rows] == [
            (ABOVE_31, ABOVE_31 + 10, ABOVE_31 + 11), (MAX_BLOCK, LAST_DEADLINE - 1, LAST_DEADLINE)]
        assert {(r.opening_bytes, r.replay_loss_bits, r.miner_slashed, r.penalty) for r in rows} == {
            (5 << 30, 0xC0490FDB, MAX_BOND, BOND)}
        assert [r.escalate_deadline for r in rows] == [ABOVE_31 + 12, LAST_DEADLINE + 1]
        stakes = c.execute(sa.select(stake_events).order_by(stake_events.c.id)).all()
        assert [(s.block, s.amount, s.bond, s.release_block) for s in stakes] == [
            (ABOVE_31, BOND, MAX_BOND, None), (MAX_BLOCK, BOND, MAX_BOND - BOND, LAST_DEADLINE)]
        assert c.execute(sa.select(txs.c.sent_block, txs.c.block)).one() == (
            LAST_DEADLINE - 3,
            LAST_DEADLINE - 2,
        )
        # the values compare as numbers in queries too (the daemon orders jobs by deadline)
        assert c.execute(sa.select(sa.func.count()).select_from(challenges)
                         .where(challenges.c.commit_deadline > ABOVE_31 + 8)).scalar() == 2


def test_a_0003_database_migrates_to_64_bit_columns_keeping_its_rows_and_their_links(db_url):
    from alembic import command

    eng = make_engine(db_url)
    try:
        command.upgrade(_alembic_config(eng), "0003")
        with eng.begin() as c:
            c.execute(node_meta.insert().values(key="schema", value=SCHEMA_NAME))
            c.execute(runs.insert().values(**{**_run(b"\x01" * 32, 5), "slashed": 3}))
            c.execute(
                challenges.insert().values(
                    **{
                        **_before_v3(_challenge(b"\x02" * 32, b"\x01" * 32, 7, 20)),
                        "opening_bytes": 1000,
                        "replay_loss_bits": 5,
                        "miner_slashed": 3,
                        "penalty": 2,
                    }
                )
            )
            c.execute(stage_log.insert().values(challenge_id=b"\x02" * 32, stage="fetch", started_at=1.0))
        migrate(eng)
        assert current_revision(eng) == head_revision() == "0005"
        with eng.begin() as c:
            assert c.execute(sa.select(challenges.c.reveal_deadline, challenges.c.run_id)).one() == (
                20,
                b"\x01" * 32,
            )
            assert c.execute(sa.select(stage_log.c.challenge_id)).scalar() == b"\x02" * 32
            c.execute(sa.update(challenges).values(reveal_deadline=LAST_DEADLINE))
            assert c.execute(sa.select(challenges.c.reveal_deadline)).scalar() == LAST_DEADLINE
        if eng.dialect.name == "sqlite":  # the rebuilt tables kept their foreign keys, and they are on
            with eng.connect() as c:
                assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
                fks = c.exec_driver_sql("PRAGMA foreign_key_list(challenges)").fetchall()
                assert [(f[2], f[3], f[4]) for f in fks] == [("runs", "run_id", "run_id")]
        open_database(db_url).dispose()
    finally:
        eng.dispose()


def test_a_0004_database_migrates_to_protocol_v3_keeping_its_rows(db_url):
    """Revision 0005 adds a challenge's escalation deadline and this node's escalation of it:
    empty (null) for the rows of an older node, written and read back once migrated."""
    from alembic import command

    eng = make_engine(db_url)
    try:
        command.upgrade(_alembic_config(eng), "0004")
        old = {
            **_before_v3(_challenge(b"\x02" * 32, b"\x01" * 32, 7, 20)),
            "attempts": 0,
            "next_attempt_at": 0.0,
        }
        with eng.begin() as c:
            c.execute(node_meta.insert().values(key="schema", value=SCHEMA_NAME))
            c.execute(runs.insert().values(**_run(b"\x01" * 32, 5)))
            c.execute(sa.insert(sa.table("challenges", *[sa.column(k) for k in old])).values(**old))
        assert "escalate_deadline" not in {col["name"] for col in sa.inspect(eng).get_columns("challenges")}
        migrate(eng)
        assert current_revision(eng) == head_revision() == "0005"
        with eng.begin() as c:
            row = c.execute(sa.select(challenges)).one()
            assert (row.reveal_deadline, row.escalate_deadline, row.escalation) == (20, None, None)
            c.execute(
                sa.update(challenges).values(escalate_deadline=LAST_DEADLINE, escalation="unaffordable")
            )
            assert c.execute(sa.select(challenges.c.escalate_deadline, challenges.c.escalation)).one() == (
                LAST_DEADLINE, "unaffordable")
        open_database(db_url).dispose()
    finally:
        eng.dispose()
