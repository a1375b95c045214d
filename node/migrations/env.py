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
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
