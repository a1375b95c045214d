"""Alembic migrations of the node database (run through node.db.migrate)."""
