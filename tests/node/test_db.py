"""Node database: migrations create exactly the model; unmigrated and foreign databases are refused."""

from __future__ import annotations

import os
import stat

import pytest
import sqlalchemy as sa

from node.db import (
    SCHEMA_NAME,
    DatabaseError,
    current_revision,
    head_revision,
    make_engine,
    metadata,
    node_meta,
    open_database,
)


def test_init_migrates_to_head_and_stamps_schema(engine):
    assert current_revision(engine) == head_revision()
    with engine.connect() as c:
        assert (
            c.execute(sa.select(node_meta.c.value).where(node_meta.c.key == "schema")).scalar() == SCHEMA_NAME
        )


def test_migrations_match_the_model(engine):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), metadata)
    assert diff == []


def test_init_twice_is_harmless(db_url):
    open_database(db_url, init=True).dispose()
    eng = open_database(db_url, init=True)
    with eng.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(node_meta)
                         .where(node_meta.c.key == "schema")).scalar() == 1
    eng.dispose()


def test_unmigrated_database_is_refused_without_init(db_url):
    with pytest.raises(DatabaseError, match="not initialised; run `pot node init"):
        open_database(db_url)


def test_foreign_database_is_refused_even_with_init(db_url):
    eng = make_engine(db_url)
    with eng.begin() as c:
        c.execute(sa.text("CREATE TABLE accounts (id INTEGER PRIMARY KEY)"))
    eng.dispose()
    with pytest.raises(DatabaseError, match="foreign database"):
        open_database(db_url)
    with pytest.raises(DatabaseError, match="refusing to initialise a foreign database"):
        open_database(db_url, init=True)


def test_other_schema_name_is_refused(engine, db_url):
    with engine.begin() as c:
        c.execute(node_meta.update().where(node_meta.c.key == "schema").values(value="someone-else"))
    with pytest.raises(DatabaseError, match="belongs to 'someone-else'"):
        open_database(db_url)


def test_old_revision_is_refused(engine, db_url):
    with engine.begin() as c:
        c.execute(sa.text("UPDATE alembic_version SET version_num = '0000'"))
    with pytest.raises(DatabaseError, match="schema revision 0000"):
        open_database(db_url)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_sqlite_database_and_its_journal_files_are_private(tmp_path):
    data_dir = tmp_path / "new-data"
    path = data_dir / "node.db"
    eng = open_database(f"sqlite:///{path}", init=True)
    try:
        with eng.begin() as c:  # a write, so SQLite has its WAL and shared-memory files open
            c.execute(node_meta.insert().values(key="probe", value="x"))
            sides = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
            assert all(s.exists() for s in sides)
            assert [_mode(s) for s in sides] == [0o600, 0o600]
        assert _mode(path) == 0o600
        assert _mode(data_dir) == 0o700
    finally:
        eng.dispose()


def test_existing_sqlite_files_are_narrowed_and_existing_folders_kept(tmp_path):
    path = tmp_path / "node.db"
    eng = open_database(f"sqlite:///{path}", init=True)
    eng.dispose()
    os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o755)
    wal = path.with_name("node.db-wal")
    wal.write_bytes(b"")
    os.chmod(wal, 0o644)
    eng = open_database(f"sqlite:///{path}")
    try:
        assert _mode(path) == 0o600 and _mode(wal) == 0o600
        assert _mode(tmp_path) == 0o755  # the operator's folder: its mode is theirs
    finally:
        eng.dispose()


def test_a_0001_database_migrates_to_witness_conflicts_keeping_its_rows(db_url):
    from alembic import command

    from node.db import _alembic_config, migrate, witness_conflicts

    eng = make_engine(db_url)
    try:
        command.upgrade(_alembic_config(eng), "0001")
        with eng.begin() as c:
            c.execute(node_meta.insert().values(key="schema", value=SCHEMA_NAME))
        assert (
            current_revision(eng) == "0001" and "witness_conflicts" not in sa.inspect(eng).get_table_names()
        )
        with pytest.raises(DatabaseError, match="run `pot node init"):
            open_database(db_url)
        migrate(eng)
        assert current_revision(eng) == head_revision() == "0005"
        with eng.begin() as c:
            c.execute(
                witness_conflicts.insert().values(
                    challenge_id=bytes(32),
                    verifier="v1",
                    journaled_value_hash=b"\x01" * 32,
                    journaled_norm_bucket=1,
                    recomputed_value_hash=b"\x02" * 32,
                    recomputed_norm_bucket=2,
                    created_at=1.0,
                )
            )
            assert (
                c.execute(sa.select(node_meta.c.value).where(node_meta.c.key == "schema")).scalar()
                == SCHEMA_NAME
            )
        open_database(db_url).dispose()
    finally:
        eng.dispose()


def test_a_0002_database_migrates_to_protocol_v2_keeping_its_rows(db_url):
    from alembic import command

    from node.db import _alembic_config, migrate, stake_events, witnesses

    eng = make_engine(db_url)
    try:
        command.upgrade(_alembic_config(eng), "0002")
        with eng.begin() as c:
            c.execute(node_meta.insert().values(key="schema", value=SCHEMA_NAME))
            c.execute(sa.text("INSERT INTO witnesses (challenge_id, verifier, salt, value_hash, norm_bucket, "
                              "commitment, created_at) VALUES (:c, 'v1', :s, :v, 3, :m, 1.0)"),
                      {"c": bytes(32), "s": b"\x01" * 32, "v": b"\x02" * 32, "m": b"\x03" * 32})
        assert "stake_events" not in sa.inspect(eng).get_table_names()
        migrate(eng)
        assert current_revision(eng) == head_revision() == "0005"
        with eng.begin() as c:
            row = c.execute(sa.select(witnesses)).one()
            assert (bytes(row.value_hash), row.norm_bucket, row.proof_hash) == (b"\x02" * 32, 3, None)
            c.execute(
                stake_events.insert().values(
                    block=1, name="VerifierBonded", verifier="v1", amount=100, bond=100, created_at=1.0
                )
            )
        cols = {col["name"] for col in sa.inspect(eng).get_columns("challenges")}
        assert {
            "round",
            "first_id",
            "committee",
            "on_committee",
            "rechallenge",
            "opening_mirrors",
            "opening_source",
            "replay_proof_hash",
            "proof_hash",
            "penalty",
            "penalty_why",
        } <= cols
        open_database(db_url).dispose()
    finally:
        eng.dispose()
