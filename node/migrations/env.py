"""Alembic environment for the node database, driven from node.db (no alembic.ini needed).

The engine comes in through `config.attributes["engine"]`; migrations run in one transaction.
"""

from __future__ import annotations

from alembic import context

from node.db import metadata

config = context.config
engine = config.attributes.get("engine")
if engine is None:
    raise RuntimeError("node migrations run through node.db.migrate(engine), which passes the engine")

with engine.connect() as connection:
    # SQLite changes a column's type by rebuilding its table (batch mode): dropping the old table
    # must not trip the foreign keys of the tables that reference it. The pragma only takes effect
    # outside a transaction, so it is set on the driver's connection before the migrations begin,
    # and the keys are checked and switched back on after they commit.
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:
        connection.connection.dbapi_connection.execute("PRAGMA foreign_keys = OFF")
    try:
        context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(
                        f"the migration left rows whose foreign keys point nowhere: {broken[:5]}"
                    )
        connection.commit()
    finally:
        if sqlite:
            connection.connection.dbapi_connection.execute("PRAGMA foreign_keys = ON")
