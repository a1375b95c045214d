"""The node's database: the chain cursor, runs, challenge jobs, the witness journal and its txs.

SQLAlchemy Core tables (the Alembic migrations in node/migrations create exactly these); SQLite
by default, PostgreSQL in production. `open_database` refuses an unmigrated or foreign database
unless asked to initialise it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url

from commitments.files import create_private, make_private_dir
from node.stages import STAGE_WIDTH

SCHEMA_NAME = "pot-verifier-node"
MIGRATIONS_DIR = Path(__file__).with_name("migrations")

metadata = MetaData()
# Block numbers, deadlines, stakes, amounts, penalties and sizes are BigInteger (64-bit): the
# protocol's parameters let them reach 2^62 and more (chain/protocol/params.py derives the bounds),
# past PostgreSQL's 32-bit INTEGER. Steps, tree sizes, indexes, rounds, buckets and counters stay
# Integer: their caps are below 2^31.

node_meta = Table(
    "node_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

# One row (id = 1): the last finalized block applied, updated in the same transaction as the jobs
# that block's events created (exactly once), and a protocol-state snapshot. The snapshot is
# rewritten only every few blocks (its own `head` says which block it is of); a restart re-derives
# the blocks from there to `block` from the chain, so a block's write does not cost the history.
chain_cursor = Table(
    "chain_cursor", metadata,
    Column("id", Integer, primary_key=True),
    Column("block", BigInteger, nullable=False),
    Column("block_hash", LargeBinary, nullable=True),
    Column("snapshot", LargeBinary, nullable=False),
    Column("updated_at", Float, nullable=False),
)

chain_events = Table(
    "chain_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("block", BigInteger, nullable=False),
    Column("position", Integer, nullable=False),
    Column("name", String(64), nullable=False),
    Column("challenge_id", LargeBinary, nullable=True),
    Column("run_id", LargeBinary, nullable=True),
    Column("body", Text, nullable=False),
    UniqueConstraint("block", "position", name="uq_chain_events_block_position"),
)
Index("ix_chain_events_challenge", chain_events.c.challenge_id)

runs = Table(
    "runs", metadata,
    Column("run_id", LargeBinary, primary_key=True),
    Column("miner", String(128), nullable=False),
    Column("spec_digest", LargeBinary, nullable=False),
    Column("mode", String(16), nullable=False),
    Column("declared_steps", Integer, nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("initial_hash", LargeBinary, nullable=False),
    Column("schedule_commitment", LargeBinary, nullable=False),
    Column("dataset_hash", LargeBinary, nullable=False),
    Column("registered_block", BigInteger, nullable=False),
    Column("slashed", BigInteger, nullable=False, default=0),
)

challenges = Table(
    "challenges", metadata,
    Column("challenge_id", LargeBinary, primary_key=True),
    Column("run_id", LargeBinary, ForeignKey("runs.run_id"), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("root", LargeBinary, nullable=False),
    Column("size", Integer, nullable=False),
    Column("mode", String(16), nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("issued_block", BigInteger, nullable=False),
    Column("opening_deadline", BigInteger, nullable=False),
    Column("commit_deadline", BigInteger, nullable=False),
    Column("reveal_deadline", BigInteger, nullable=False),
    # A node.stages.Stage value (the stages and their order are documented there). `status` says
    # why a job stopped or waits.
    Column("stage", String(STAGE_WIDTH), nullable=False),
    Column("opening_digest", LargeBinary, nullable=True),
    Column("opening_uri", Text, nullable=True),
    Column("leaf", LargeBinary, nullable=True),
    Column("leaf_hash", LargeBinary, nullable=True),
    Column("opening_block", BigInteger, nullable=True),
    Column("opening_path", Text, nullable=True),
    Column("opening_bytes", BigInteger, nullable=True),
    Column("refusal_class", String(32), nullable=True),
    Column("refusal_reason", Text, nullable=True),
    Column("loss_checks", Text, nullable=True),  # JSON report
    Column("replay_leaf", LargeBinary, nullable=True),
    Column("replay_state_digest", LargeBinary, nullable=True),
    Column("replay_loss_bits", BigInteger, nullable=True),
    Column("matches_leaf", Boolean, nullable=True),
    Column("value_hash", LargeBinary, nullable=True),
    Column("norm_bucket", Integer, nullable=True),
    Column("fault", String(16), nullable=True),
    Column("verdict", String(16), nullable=True),
    Column("verdict_reason", Text, nullable=True),
    Column("resolved_block", BigInteger, nullable=True),
    Column("winning_value", Text, nullable=True),
    Column("in_winning_cluster", Boolean, nullable=True),
    Column("outlier", Boolean, nullable=True),
    Column("miner_slashed", BigInteger, nullable=True),
    Column("status", Text, nullable=True),
    # Protocol v2 (revision 0003): the round of the challenge, its first round's id, its
    # committee (JSON list of accounts) and whether this node sits on it; the next round's id once
    # this one re-challenged; the opening's mirrors (JSON list) and the address that served it; the
    # replay's proof hash and the journaled one; what the chain took from this node's bond for it.
    Column("round", Integer, nullable=True),
    Column("first_id", LargeBinary, nullable=True),
    Column("committee", Text, nullable=True),
    Column("on_committee", Boolean, nullable=True),
    Column("rechallenge", LargeBinary, nullable=True),
    Column("opening_mirrors", Text, nullable=True),
    Column("opening_source", Text, nullable=True),
    Column("replay_proof_hash", LargeBinary, nullable=True),
    Column("proof_hash", LargeBinary, nullable=True),
    Column("penalty", BigInteger, nullable=True),
    Column("penalty_why", String(16), nullable=True),
    # Protocol v3 (revision 0005): the last block of the round's escalation window (it resolves at
    # the block after), and this node's escalation of it: journaled | unaffordable | escalated |
    # returned | forfeited (null: none).
    Column("escalate_deadline", BigInteger, nullable=True),
    Column("escalation", String(16), nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", Float, nullable=False, default=0.0),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)
Index("ix_challenges_stage", challenges.c.stage)

# A challenge's timeline: one row per stage with its start and end (the dashboard's durations).
stage_log = Table(
    "stage_log", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("challenge_id", LargeBinary, ForeignKey("challenges.challenge_id"), nullable=False),
    Column("stage", String(STAGE_WIDTH), nullable=False),  # a Stage value, or RESOLUTION
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("detail", Text, nullable=True),
)
Index("ix_stage_log_challenge", stage_log.c.challenge_id)

# The witness journal: written in ONE transaction before the commitment leaves the node. The
# UNIQUE (challenge_id, verifier) makes a second, different commitment impossible.
witnesses = Table(
    "witnesses", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("challenge_id", LargeBinary, nullable=False),
    Column("verifier", String(128), nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("value_hash", LargeBinary, nullable=False),
    Column("norm_bucket", Integer, nullable=False),
    Column("commitment", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("proof_hash", LargeBinary, nullable=True),  # the pair's proof half (null: journaled before v2)
    UniqueConstraint("challenge_id", "verifier", name="uq_witnesses_challenge_verifier"),
)

# The determinism alarm: a witness recomputed for a challenge already journaled, with a different
# value or norm bucket. The journaled entry stays the one sent; each such repeat leaves a row here,
# so the alarm outlives restarts. `acknowledged_at`: an operator looked at it (readiness passes).
witness_conflicts = Table(
    "witness_conflicts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("challenge_id", LargeBinary, nullable=False),
    Column("verifier", String(128), nullable=False),
    Column("journaled_value_hash", LargeBinary, nullable=False),
    Column("journaled_norm_bucket", Integer, nullable=False),
    Column("recomputed_value_hash", LargeBinary, nullable=False),
    Column("recomputed_norm_bucket", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("acknowledged_at", Float, nullable=True),
    Column("journaled_proof_hash", LargeBinary, nullable=True),
    Column("recomputed_proof_hash", LargeBinary, nullable=True),
)
Index("ix_witness_conflicts_challenge", witness_conflicts.c.challenge_id)

# This node's stake as the chain recorded it, one row per event of its account: VerifierBonded
# (amount, bond after), VerifierUnbonding (amount, release_block, bond left), BondReleased (amount),
# VerifierPenalized (amount taken, challenge_id, why: no_commit | no_reveal | outlier), and since
# protocol v3 VerifierPaid (amount credited, challenge_id, why: seat_fee | slash_share |
# dispute_pool), ChallengeEscalated (the stake reserved, challenge_id) and EscalationSettled (the
# stake returned or forfeited, challenge_id, why: returned | forfeited).
stake_events = Table(
    "stake_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("block", BigInteger, nullable=False),
    Column("name", String(32), nullable=False),
    Column("verifier", String(128), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("bond", BigInteger, nullable=True),
    Column("release_block", BigInteger, nullable=True),
    Column("challenge_id", LargeBinary, nullable=True),
    Column("why", String(16), nullable=True),
    Column("created_at", Float, nullable=False),
)
Index("ix_stake_events_verifier", stake_events.c.verifier)

# Transactions, Chainlink style: unstarted -> in_progress -> unconfirmed -> confirmed (or failed).
# `payload` is the exact call bytes and `origin` the signer; a restart re-sends these bytes.
txs = Table(
    "txs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("challenge_id", LargeBinary, nullable=False),
    Column("verifier", String(128), nullable=False),
    Column("kind", String(16), nullable=False),  # commit | reveal | escalate
    Column("origin", String(128), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("state", String(16), nullable=False),
    Column("tx_hash", LargeBinary, nullable=True),
    Column("sent_block", BigInteger, nullable=True),  # finalized head when last sent
    Column("block", BigInteger, nullable=True),  # block that included it
    Column("sends", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("challenge_id", "verifier", "kind", name="uq_txs_challenge_verifier_kind"),
)

TX_STATES = ("unstarted", "in_progress", "unconfirmed", "confirmed", "failed")


class DatabaseError(RuntimeError):
    """A database the node cannot use (unmigrated, foreign, unreachable), with what to do."""


# SQLite's companion files: they hold the same rows as the database until a checkpoint.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_sqlite_file(path: str | os.PathLike[str]) -> None:
    """The database holds the witness salts: create it 0600 (its folder 0700 if new) before SQLite
    opens it, and narrow an existing one and its companion files, which SQLite creates with the
    database file's mode."""
    p = Path(path)
    make_private_dir(p.parent)
    try:
        create_private(p)
        for suffix in SQLITE_SIDE_FILES:
            side = p.with_name(p.name + suffix)
            if side.exists():
                create_private(side)
    except OSError as exc:
        raise DatabaseError(f"cannot make the node database {p} private (mode 600): {exc.strerror or exc}; "
                            f"run the node as the owner of {p.parent}") from None


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:"):
        path = make_url(url).database
        if path and path != ":memory:" and not path.startswith("file:"):
            private_sqlite_file(path)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:
            # WAL lets the HTTP API read while the daemon writes; FULL sync: a journal entry
            # that was committed survives a power cut, not only a process crash.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = FULL")
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute("PRAGMA busy_timeout = 30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn) -> None:
            # Take the write lock at BEGIN so concurrent writers queue instead of failing mid-way.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})


def _alembic_config(engine: Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    cfg = _alembic_config(None)  # type: ignore[arg-type]
    return ScriptDirectory.from_config(cfg).get_current_head()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision and stamp it as this node's database."""
    from alembic import command

    command.upgrade(_alembic_config(engine), "head")
    with engine.begin() as conn:
        found = conn.execute(select(node_meta.c.value).where(node_meta.c.key == "schema")).scalar()
        if found is None:
            conn.execute(node_meta.insert().values(key="schema", value=SCHEMA_NAME))
            conn.execute(node_meta.insert().values(key="created_at", value=str(time.time())))


def check_database(engine: Engine) -> None:
    """Refuse a database that is not a fully migrated node database, saying what to do."""
    url = engine.url.render_as_string(hide_password=True)
    try:
        tables = set(inspect(engine).get_table_names())
    except Exception as exc:  # driver errors vary by backend; the message is what matters
        raise DatabaseError(f"cannot open the node database {url}: {exc}") from None
    if "alembic_version" not in tables or "node_meta" not in tables:
        if tables - {"alembic_version"}:
            raise DatabaseError(
                f"{url} holds tables that are not a verifier node's ({', '.join(sorted(tables)[:6])}); "
                f"refusing to use a foreign database")
        raise DatabaseError(f"{url} is not initialised; run `pot node init --config ...` "
                            f"(or `pot node run --init`)")
    with engine.connect() as conn:
        schema = conn.execute(select(node_meta.c.value).where(node_meta.c.key == "schema")).scalar()
    if schema != SCHEMA_NAME:
        raise DatabaseError(f"{url} belongs to {schema!r}, not {SCHEMA_NAME!r}; refusing a foreign database")
    rev, head = current_revision(engine), head_revision()
    if rev != head:
        raise DatabaseError(f"{url} is at schema revision {rev}, this node needs {head}; "
                            f"run `pot node init --config ...` to migrate")


def open_database(url: str, *, init: bool = False) -> Engine:
    """An engine on a checked node database; with `init`, create or migrate it first."""
    engine = make_engine(url)
    try:
        if init:
            tables = set(inspect(engine).get_table_names())
            if tables and "node_meta" not in tables:
                raise DatabaseError(
                    f"{engine.url.render_as_string(hide_password=True)} holds other tables "
                    f"({', '.join(sorted(tables)[:6])}); refusing to initialise a foreign database")
            migrate(engine)
        check_database(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def bump_counter(conn, prefix: str, name: str, n: int = 1) -> None:
    """Add `n` to the node_meta counter `prefix + name` (created at `n`), in the caller's transaction."""
    key = prefix + name
    row = conn.execute(select(node_meta.c.value).where(node_meta.c.key == key)).first()
    if row is None:
        conn.execute(node_meta.insert().values(key=key, value=str(n)))
    else:
        conn.execute(update(node_meta).where(node_meta.c.key == key).values(value=str(int(row.value) + n)))


def counters(conn, prefix: str) -> dict[str, int]:
    """Every node_meta counter under `prefix`, by the name after it."""
    rows = conn.execute(select(node_meta.c.key, node_meta.c.value).where(node_meta.c.key.like(prefix + "%")))
    return {k[len(prefix):]: int(v) for k, v in rows}


# Counters of payloads the follower ignored, by reason, kept in node_meta (key prefix below) and
# bumped in the same transaction as the block that carried them: a bounded set of rows.
IGNORED_KEY = "remarks_ignored:"


def count_ignored(conn, reason: str, n: int = 1) -> None:
    bump_counter(conn, IGNORED_KEY, reason, n)


def ignored_counts(conn) -> dict[str, int]:
    return counters(conn, IGNORED_KEY)
