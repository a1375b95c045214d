"""The embedded dev chain: blocks in one SQLite file that several processes share.

Submissions append pending transactions (origin account, pot1 call bytes); a block seals every
pending transaction, either at once on submit ("instant") or from a sealer loop every few seconds
("interval", `pot chain dev --db FILE --interval 1.0`). A block is final when sealed. Its hash is
BLAKE3 over (parent hash, number, timestamp, transactions): dev randomness is NOT secure — whoever
submits can grind it — and is meant for development and tests only.

The account that creates the file (the first DevTransport to open it, `pot chain dev --authority`)
is recorded with its genesis as the network's authority: every participant of the chain reads it
from the file, so only its configure_network records count, whoever sends one first.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chain.calls import CallDecodeError, CallError, Ignored, encode_call, read_payload
from chain.protocol.params import ProtocolParams
from chain.transport import Block, Receipt, Transport, TransportError
from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import digest

log = logging.getLogger(__name__)

SCHEMA = "pot-dev-chain/v1"
BUSY_TIMEOUT_S = 30.0
SEALINGS = ("instant", "interval")
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

_DDL = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS blocks (number INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE,"
    " parent BLOB NOT NULL, timestamp_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS txs (id INTEGER PRIMARY KEY AUTOINCREMENT, tx_hash BLOB NOT NULL,"
    " origin TEXT NOT NULL, payload BLOB NOT NULL, submitted_ms INTEGER NOT NULL,"
    " block INTEGER REFERENCES blocks(number), position INTEGER)",
    "CREATE INDEX IF NOT EXISTS txs_block ON txs (block, position)",
    "CREATE INDEX IF NOT EXISTS txs_hash ON txs (tx_hash)",
]


def block_hash(parent: bytes, number: int, timestamp_ms: int, txs: list[tuple[str, bytes]]) -> bytes:
    """BLAKE3 over (parent hash, number, timestamp, [origin, call bytes]...)."""
    return digest("pot/dev/block/v1", parent, number, timestamp_ms, [[o, p] for o, p in txs])


def genesis_hash() -> bytes:
    return digest("pot/dev/genesis/v1")


def _now_ms() -> int:
    return int(time.time() * 1000)


class DevChain:
    """One dev-chain file: schema, sealing, reading. Thread-safe; one connection per instance."""

    def __init__(self, path: str | Path, *, sealing: str | None = None, busy_timeout: float = BUSY_TIMEOUT_S,
                 creator: str | None = None):
        self.path = Path(path)
        if creator is not None and not ACCOUNT_RE.match(creator):
            raise TransportError(f"dev account names are 1-64 of [A-Za-z0-9._-], got {creator!r}")
        if sealing is not None and sealing not in SEALINGS:
            raise TransportError(f"dev chain sealing must be one of {SEALINGS}, got {sealing!r}")
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise TransportError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._init_schema(sealing, creator)
        except sqlite3.DatabaseError as exc:
            raise TransportError(f"{self.path}: not a usable dev chain file: {exc}") from None
        except OSError as exc:
            raise TransportError(f"{self.path}: cannot open dev chain file: {exc}") from None

    # --- schema ---------------------------------------------------------------------------
    def _init_schema(self, sealing: str | None, creator: str | None = None) -> None:
        """Create the tables, genesis and metadata of a new file (its creator, if named, becomes the
        network's authority: meta 'authority'), or check an existing file's schema."""
        with self._write() as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "meta" not in tables:
                raise TransportError(
                    f"{self.path}: an SQLite file that is not a dev chain (tables: {sorted(tables)})"
                )
            for stmt in _DDL:
                db.execute(stmt)
            schema = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if schema is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
                db.execute("INSERT INTO blocks VALUES (0, ?, ?, ?)", (genesis_hash(), bytes(32), _now_ms()))
                if creator is not None:
                    db.execute("INSERT INTO meta VALUES ('authority', ?)", (creator,))
            elif schema[0] != SCHEMA:
                raise TransportError(
                    f"{self.path}: dev chain schema {schema[0]!r}, this node reads {SCHEMA!r}"
                )
            if sealing is not None:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('sealing', ?)", (sealing,))

    class _Tx:
        def __init__(self, chain: DevChain) -> None:
            self.chain = chain

        def __enter__(self) -> sqlite3.Connection:
            self.chain._lock.acquire()
            try:
                # IMMEDIATE takes the write lock up front: two processes sealing at once serialise
                # here (waiting up to the busy timeout) instead of failing half-way.
                self.chain._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.chain._lock.release()
                raise
            return self.chain._db

        def __exit__(self, exc_type, exc, tb) -> None:
            try:
                self.chain._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
            finally:
                self.chain._lock.release()

    def _write(self) -> DevChain._Tx:
        return DevChain._Tx(self)

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise TransportError(f"{self.path}: read failed: {exc}") from None

    # --- meta -----------------------------------------------------------------------------
    def meta(self, key: str) -> Any:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: Any) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    @property
    def sealing(self) -> str:
        return self.meta("sealing") or "instant"

    # --- writing --------------------------------------------------------------------------
    def append(self, origin: str, payloads: list[bytes], *, seal: bool) -> Receipt:
        """Append one transaction (one or more call payloads); seal a block at once if asked."""
        if not isinstance(origin, str) or not ACCOUNT_RE.match(origin):
            raise TransportError(f"dev account names are 1-64 of [A-Za-z0-9._-], got {origin!r}")
        if not payloads:
            raise TransportError("a transaction needs at least one call")
        try:
            with self._write() as db:
                now = _now_ms()
                first = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM txs").fetchone()[0]
                tx_hash = digest("pot/dev/tx/v1", first, origin, list(payloads), now)
                db.executemany(
                    "INSERT INTO txs (tx_hash, origin, payload, submitted_ms) VALUES (?, ?, ?, ?)",
                    [(tx_hash, origin, p, now) for p in payloads],
                )
                if seal:
                    number, bhash = self._seal(db)
                    return Receipt(tx_hash, number, bhash)
                return Receipt(tx_hash)
        except sqlite3.Error as exc:
            raise TransportError(f"{self.path}: could not append the transaction: {exc}") from None

    def seal(self) -> tuple[int, bytes]:
        """Seal one block now with every pending transaction (possibly none)."""
        try:
            with self._write() as db:
                return self._seal(db)
        except sqlite3.Error as exc:
            raise TransportError(f"{self.path}: could not seal a block: {exc}") from None

    def _seal(self, db: sqlite3.Connection) -> tuple[int, bytes]:
        number, parent, parent_ts = db.execute(
            "SELECT number, hash, timestamp_ms FROM blocks ORDER BY number DESC LIMIT 1"
        ).fetchone()
        pending = db.execute("SELECT id, origin, payload FROM txs WHERE block IS NULL ORDER BY id").fetchall()
        ts = max(_now_ms(), parent_ts)  # timestamps never go back, whatever the wall clock does
        n = number + 1
        bhash = block_hash(parent, n, ts, [(o, p) for _, o, p in pending])
        db.execute("INSERT INTO blocks VALUES (?, ?, ?, ?)", (n, bhash, parent, ts))
        db.executemany("UPDATE txs SET block = ?, position = ? WHERE id = ?",
                       [(n, i, tx_id) for i, (tx_id, _, _) in enumerate(pending)])
        return n, bhash

    def run_sealer(self, interval: float, stop: Callable[[], bool] | None = None,
                   on_block: Callable[[int, bytes], None] | None = None) -> None:
        """Seal a block every `interval` seconds until `stop()` is true (or forever)."""
        if not interval > 0:
            raise TransportError(f"the sealing interval must be positive, got {interval}")
        self.set_meta("sealing", "interval")
        nxt = time.monotonic()
        while stop is None or not stop():
            nxt += interval
            try:
                number, bhash = self.seal()
                if on_block is not None:
                    on_block(number, bhash)
            except TransportError as exc:
                log.warning("dev sealer: %s (retrying next tick)", exc)
            time.sleep(max(0.0, nxt - time.monotonic()))

    # --- reading --------------------------------------------------------------------------
    def head(self) -> int:
        return self._read("SELECT MAX(number) FROM blocks")[0][0]

    def tx_block(self, tx_hash: bytes) -> tuple[int, bytes] | None:
        rows = self._read(
            "SELECT b.number, b.hash FROM txs t JOIN blocks b ON b.number = t.block WHERE t.tx_hash = ? "
            "LIMIT 1",
            (tx_hash,),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def raw_block(self, number: int) -> tuple[bytes, bytes, int, list[tuple[str, bytes]]] | None:
        """(hash, parent, timestamp_ms, [(origin, payload)]) of a sealed block, or None."""
        rows = self._read("SELECT hash, parent, timestamp_ms FROM blocks WHERE number = ?", (number,))
        if not rows:
            return None
        txs = self._read("SELECT origin, payload FROM txs WHERE block = ? ORDER BY position", (number,))
        return rows[0][0], rows[0][1], rows[0][2], [(o, bytes(p)) for o, p in txs]

    def pending(self) -> int:
        return self._read("SELECT COUNT(*) FROM txs WHERE block IS NULL")[0][0]

    def verify(self) -> list[str]:
        """Recompute every block hash and parent link; return the problems found (none: [])."""
        problems = []
        parent = None
        for number in range(self.head() + 1):
            raw = self.raw_block(number)
            if raw is None:
                problems.append(f"block {number} is missing")
                continue
            bhash, par, ts, txs = raw
            if number == 0:
                if bhash != genesis_hash():
                    problems.append("block 0 is not the dev genesis")
            else:
                if par != parent:
                    problems.append(f"block {number}: parent does not match the hash of block {number - 1}")
                if block_hash(par, number, ts, txs) != bhash:
                    problems.append(f"block {number}: hash does not match its contents")
            parent = bhash
        return problems

    def close(self) -> None:
        with self._lock:
            self._db.close()


class DevTransport(Transport):
    """The Transport of one account over a dev-chain file."""

    def __init__(self, path: str | Path, account: str = "alice", *, sealing: str | None = None,
                 busy_timeout: float = BUSY_TIMEOUT_S, poll: float = 0.05) -> None:
        if not isinstance(account, str) or not ACCOUNT_RE.match(account):
            raise TransportError(f"dev account names are 1-64 of [A-Za-z0-9._-], got {account!r}")
        self._account = account
        self._poll = poll
        self.chain = DevChain(path, sealing=sealing, busy_timeout=busy_timeout, creator=account)

    @property
    def account(self) -> str:
        return self._account

    def submit(self, calls: list[Any], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        try:
            payloads = [encode_call(c) for c in calls]
        except CallError as exc:
            raise TransportError(f"cannot encode the call: {exc}") from None
        return self.submit_payloads(payloads, wait=wait, timeout=timeout)

    def submit_payloads(self, payloads: list[bytes], *, wait: bool = True, timeout: float = 60.0) -> Receipt:
        """Submit raw call payloads (a transport for foreign bytes too: they are skipped on read)."""
        instant = self.chain.sealing == "instant"
        receipt = self.chain.append(self._account, list(payloads), seal=instant)
        if instant or not wait:
            return receipt
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.chain.tx_block(receipt.tx_hash)
            if found is not None:
                return Receipt(receipt.tx_hash, found[0], found[1])
            time.sleep(self._poll)
        raise TransportError(
            f"no block included the transaction within {timeout:.0f} s: is the sealer "
            f"(`pot chain dev --db {self.chain.path} --interval ...`) running?"
        )

    def seal(self) -> int:
        """Seal a block now (tests, and instant chains whose windows must pass)."""
        return self.chain.seal()[0]

    def finalized_head(self) -> int:
        return self.chain.head()

    def block(self, number: int) -> Block:
        raw = self.chain.raw_block(number)
        if raw is None:
            raise TransportError(f"block {number} is not sealed yet (head is {self.chain.head()})")
        bhash, _, ts, txs = raw
        calls, ignored = [], []
        for i, (origin, payload) in enumerate(txs):
            got = read_payload(payload)
            if got is None:
                log.info("block %d tx %d from %s skipped: not a pot1 payload (%d bytes)", number, i, origin,
                         len(payload))
            elif isinstance(got, CallDecodeError):
                log.warning("block %d tx %d from %s ignored (%s): %s", number, i, origin, got.reason, got)
                ignored.append(Ignored.of_error(i, origin, payload, got))
            else:
                calls.append((origin, got))
        return Block(number, bhash, tuple(calls), ts / 1000.0, tuple(ignored))

    def protocol_params(self) -> ProtocolParams | None:
        """The ProtocolParams recorded in the chain file, or None."""
        raw = self.chain.meta("params")
        if raw is None:
            return None
        try:
            return ProtocolParams.from_dict(cbor.decode(raw))
        except (CommitmentError, TypeError, ValueError, KeyError) as exc:
            raise TransportError(f"{self.chain.path}: recorded protocol params are unusable: {exc}") from None

    def network_authority(self) -> str | None:
        """The account that created the chain file (recorded with its genesis), or None for a file
        made before dev chains recorded one (its first accepted record names the authority)."""
        raw = self.chain.meta("authority")
        if raw is None:
            return None
        if not isinstance(raw, str) or not ACCOUNT_RE.match(raw):
            raise TransportError(
                f"{self.chain.path}: the recorded authority {raw!r} is not a dev account name"
            )
        return raw

    def record_params(self, params: ProtocolParams) -> None:
        self.chain.set_meta("params", cbor.encode(params.to_dict()))

    def close(self) -> None:
        self.chain.close()
