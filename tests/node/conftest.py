"""Node test fixtures: every DB-backed test runs on SQLite and on a fresh PostgreSQL database."""

from __future__ import annotations

import uuid

import pytest

PG_ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def _fresh_pg_database():
    import sqlalchemy as sa

    name = f"pot_node_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return admin, name, f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"


def _drop_pg_database(admin, name: str) -> None:
    import sqlalchemy as sa

    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """A URL of an empty database of each kind (the PostgreSQL one is dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'node.db'}"
        return
    admin, name, url = _fresh_pg_database()
    try:
        yield url
    finally:
        _drop_pg_database(admin, name)


@pytest.fixture
def engine(db_url):
    from node.db import open_database

    eng = open_database(db_url, init=True)
    try:
        yield eng
    finally:
        eng.dispose()
