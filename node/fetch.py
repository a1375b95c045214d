"""Downloads from miners' provers: openings streamed to disk, leaf lists into memory.

Every request goes through the egress policy (node.egress: resolve, check every address, connect
to the checked one), follows no redirect, ignores proxy variables of the environment, asks for
and accepts only unencoded bodies (the caps count the bytes on the wire), and has connect/read/
total timeouts. An opening's size comes from its own manifest once that arrives (a `size_of`
gate); transient failures are retried with backoff and full jitter, and a partial download
resumes with an HTTP Range request. Files appear atomically (commitments.files.publish).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx

from commitments.files import publish
from commitments.retry import Backoff
from node.egress import EgressPolicy, EgressRefused, embedding

CHUNK = 1 << 20
# Kinds of FetchError. All of them reveal the same refusal class (challenges.refused): which one
# it was says something about this node's network, so it stays in the node's own log.
KINDS = ("bad_uri", "refused_address", "dns", "redirect", "http_status", "content_encoding", "too_large",
         "unreachable")

# (done, n): done -> the body must be exactly n bytes; not done -> call again with n bytes.
SizeGate = Callable[[bytes], tuple[bool, int]]


class FetchError(Exception):
    """A download that failed; `kind` is one of KINDS, `reason` the detail for the node's log."""

    def __init__(self, kind: str, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.retryable = retryable


class FetchStopped(Exception):
    """The node is shutting down; the partial file stays for the next start to resume."""


@dataclass(frozen=True)
class FetchPolicy:
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 300.0
    attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 15.0
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    proxy: str = ""  # an operator's proxy; the environment's HTTP(S)_PROXY are never read
    owner: str = ""  # whose download this is ("miner:<account>"): its name lookups run on that miner's slots

    @cached_property
    def _backoff(self) -> Backoff:
        return Backoff(self.backoff_base_s, self.backoff_max_s)

    def backoff(self, attempt: int) -> float:
        """The delay before retry `attempt` (0-based): full jitter, see commitments.retry."""
        return self._backoff.delay(attempt)

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_timeout_s, read=self.read_timeout_s,
                             write=self.read_timeout_s, pool=self.connect_timeout_s)

    def client(self) -> httpx.Client:
        # trust_env=False: no proxy, netrc or CA bundle from the environment decides where we go.
        return httpx.Client(timeout=self.timeout(), follow_redirects=False, trust_env=False,
                            proxy=self.proxy or None)


def resolve_uri(uri: str, endpoint: str) -> str:
    """The http(s) URL of an opening: absolute as given, or relative to the run's endpoint."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        url = uri
    elif parts.scheme == "" and endpoint:
        base = endpoint if endpoint.endswith("/") else endpoint + "/"
        url = urljoin(base, uri.lstrip("/"))
    else:
        # Never let a chain record make the node read local files or speak other protocols.
        raise FetchError("bad_uri", f"opening URI {uri[:200]!r} is not http(s) (endpoint {endpoint[:200]!r})")
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.netloc:
        raise FetchError("bad_uri", f"opening URL {url[:200]!r} is not an absolute http(s) URL")
    if "@" in split.netloc:
        raise FetchError("bad_uri", f"opening URL {url[:200]!r} carries user information")
    return url


def _status_error(resp: httpx.Response, url: str) -> FetchError:
    code = resp.status_code
    if 300 <= code < 400:
        where = resp.headers.get("location", "")[:200]
        return FetchError(
            "redirect", f"GET {url} answered HTTP {code} to {where!r}; redirects are not followed"
        )
    retryable = code in (408, 425, 429) or code >= 500
    return FetchError("http_status", f"GET {url} answered HTTP {code}", retryable=retryable)


def _check_encoding(resp: httpx.Response, url: str) -> None:
    enc = resp.headers.get("content-encoding", "").strip().lower()
    if enc and enc != "identity":
        raise FetchError(
            "content_encoding",
            f"GET {url} answered Content-Encoding {enc[:40]!r}; only unencoded "
            f"bodies are accepted (the cap counts raw bytes)",
        )


class _Watchdog:
    """Cuts one attempt's connection when its wall-clock budget is spent or the node stops: a
    prover that trickles its headers or its body a byte at a time never trips a per-read timeout."""

    def __init__(self, budget_s: float, stop=None) -> None:
        self.deadline = time.monotonic() + budget_s
        self.stop = stop
        self.fired: str | None = None  # "timeout" or "stopped"
        self._sock: socket.socket | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pot-fetch-watchdog")
        self._thread.start()

    def trace(self, event: str, info: dict) -> None:
        # httpcore's trace extension hands over the stream it connected: its socket is what we cut.
        if event.endswith("connect_tcp.complete") and info.get("return_value") is not None:
            self._sock = info["return_value"].get_extra_info("socket")
            if self.fired:
                self._cut()

    def _cut(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        while not self._done.wait(0.05):
            if time.monotonic() > self.deadline:
                self.fired = "timeout"
            elif self.stop is not None and self.stop():
                self.fired = "stopped"
            else:
                continue
            self._cut()
            return

    def close(self) -> None:
        self._done.set()

    def check(self, url: str, budget_s: float) -> None:
        """Raise what the watchdog's firing means, if it fired."""
        if self.fired == "timeout":
            raise FetchError("unreachable", f"GET {url}: not finished within {budget_s:g} s", retryable=True)
        if self.fired == "stopped":
            raise FetchStopped(f"GET {url}: stopped")


@contextmanager
def _get(client: httpx.Client, url: str, policy: FetchPolicy, headers: dict[str, str],
         watchdog: _Watchdog | None = None) -> Iterator[httpx.Response]:
    """GET `url` at an address the egress policy checked; the name stays in Host and SNI."""
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise FetchError("bad_uri", f"{url[:200]!r} is not a URL: {exc}") from None
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        # The ASCII (IDNA) form is what is looked up: the name the scheduler's endpoint key counts.
        addrs = policy.egress.resolve(target.raw_host.decode("ascii"), port, policy.owner)
    except EgressRefused as exc:
        raise FetchError("dns" if exc.retryable else "refused_address", f"GET {url}: {exc.reason}",
                         retryable=exc.retryable) from None
    hdrs = {"Host": target.netloc.decode("ascii"), "Accept-Encoding": "identity", **headers}
    ext: dict = {"sni_hostname": target.host} if target.scheme == "https" else {}
    if watchdog is not None:
        ext["trace"] = watchdog.trace
    failure: httpx.ConnectError | None = None
    for ip in addrs:
        request = client.build_request("GET", target.copy_with(host=str(ip)), headers=hdrs, extensions=ext)
        try:
            resp = client.send(request, stream=True)
        except httpx.ConnectError as exc:  # the next address of the same (checked) answer
            failure = exc
            continue
        try:
            yield resp
        finally:
            resp.close()
        return
    assert failure is not None
    raise failure


def _read_prefix(part: Path, n: int) -> bytes:
    with part.open("rb") as f:
        return f.read(n)


def _one_attempt(
    client: httpx.Client,
    url: str,
    part: Path,
    max_bytes: int,
    policy: FetchPolicy,
    stop=None,
    size_of: SizeGate | None = None,
    room: Callable[[int], None] | None = None,
) -> int:
    watchdog = _Watchdog(policy.total_timeout_s, stop)
    try:
        return _attempt_body(client, url, part, max_bytes, policy, stop, size_of, room, watchdog)
    except httpx.HTTPError:
        watchdog.check(url, policy.total_timeout_s)
        raise
    finally:
        watchdog.close()


def _attempt_body(client: httpx.Client, url: str, part: Path, max_bytes: int, policy: FetchPolicy, stop,
                  size_of: SizeGate | None, room: Callable[[int], None] | None, watchdog: _Watchdog) -> int:
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    started = time.monotonic()
    with _get(client, url, policy, headers, watchdog) as resp:
        if resp.status_code == 416 and have:
            part.unlink()  # our partial file is not a prefix of what the server has now
            raise FetchError("http_status", f"GET {url}: range not satisfiable; restarting", retryable=True)
        if resp.status_code not in (200, 206):
            raise _status_error(resp, url)
        _check_encoding(resp, url)
        if resp.status_code == 200:
            have = 0  # the server ignored the range: start over
        length = resp.headers.get("content-length")
        announced = have + int(length) if length is not None and length.isdigit() else None
        cap = max_bytes
        if announced is not None and announced > cap:
            raise FetchError("too_large", f"GET {url}: {announced} bytes announced, the cap is {cap}")
        # The gate reads the opening's first bytes (kept here until it knows the whole size).
        prefix = _read_prefix(part, CHUNK * 64) if size_of is not None and have else b""
        need: int | None = 0 if size_of is not None else None

        def gate() -> None:
            nonlocal need, cap
            while need is not None and len(prefix) >= need:
                done, n = size_of(prefix)  # type: ignore[misc]
                if not done:
                    if n <= need:
                        raise FetchError("too_large", f"GET {url}: the size gate asked for {n} bytes again")
                    need = n
                    continue
                need = None
                if n > cap:
                    raise FetchError("too_large", f"GET {url}: the opening's manifest gives {n} bytes, "
                                                  f"over the operator's cap of {cap}")
                cap = n
                if announced is not None and announced > cap:
                    raise FetchError("too_large", f"GET {url}: {announced} bytes announced, the opening's "
                                                  f"manifest gives {cap}")
                if room is not None:
                    room(cap - have)

        if room is not None:
            room(announced - have if announced is not None else 0)
        if have:
            gate()
        with part.open("r+b" if have else "wb") as f:
            f.seek(have)
            f.truncate()
            total = have
            # Raw bytes as they arrive: nothing is decoded, and a cut keeps what came.
            for chunk in resp.iter_raw():
                if total + len(chunk) > cap:
                    raise FetchError("too_large", f"GET {url}: more than the cap of {cap} bytes")
                total += len(chunk)
                if time.monotonic() - started > policy.total_timeout_s:
                    raise FetchError(
                        "unreachable",
                        f"GET {url}: not finished within {policy.total_timeout_s:g} s",
                        retryable=True,
                    )
                if stop is not None and stop():
                    raise FetchStopped(f"GET {url}: stopped at {total} bytes")
                f.write(chunk)
                if need is not None:
                    prefix += chunk
                    gate()
                    if need is None:
                        prefix = b""
    return total


def fetch_to_file(url: str, dest: str | os.PathLike[str], *, max_bytes: int,
                  policy: FetchPolicy | None = None, stop=None, size_of: SizeGate | None = None,
                  room: Callable[[int], None] | None = None) -> int:
    """Stream `url` into `dest` (atomically); return its size. Raises FetchError after the last try.

    `size_of` (optional) sees the body's first bytes and gives the exact size the body may have
    (at most `max_bytes`); what it raises ends the download. `room(n)` is asked before n more
    bytes are written and raises when the disk may not take them.
    """
    policy = policy or FetchPolicy()
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    last: FetchError | None = None
    with policy.client() as client:
        for attempt in range(policy.attempts):
            if stop is not None and stop():
                raise FetchStopped(f"GET {url}: stopped before attempt {attempt + 1}")
            try:
                size = _one_attempt(client, url, part, max_bytes, policy, stop, size_of, room)
                publish(part, dest)
                return size
            except FetchError as exc:
                last = exc
                if not exc.retryable:
                    part.unlink(missing_ok=True)
                    raise
            except httpx.HTTPError as exc:
                last = FetchError("unreachable", f"GET {url}: {type(exc).__name__}: {exc}", retryable=True)
            except FetchStopped:
                raise
            except Exception:
                part.unlink(missing_ok=True)  # the gate or the disk said no: nothing to resume
                raise
            if attempt + 1 < policy.attempts:
                time.sleep(policy.backoff(attempt))
    raise last or FetchError("unreachable", f"GET {url}: no attempt was made")


def fetch_bytes(url: str, *, max_bytes: int, policy: FetchPolicy | None = None) -> bytes:
    """GET a small document (a leaf list) into memory, capped and retried like `fetch_to_file`."""
    policy = policy or FetchPolicy()
    last: FetchError | None = None
    with policy.client() as client:
        for attempt in range(policy.attempts):
            watchdog = _Watchdog(policy.total_timeout_s)
            try:
                started = time.monotonic()
                with _get(client, url, policy, {}, watchdog) as resp:
                    if resp.status_code != 200:
                        raise _status_error(resp, url)
                    _check_encoding(resp, url)
                    length = resp.headers.get("content-length")
                    if length is not None and length.isdigit() and int(length) > max_bytes:
                        raise FetchError(
                            "too_large", f"GET {url}: {length} bytes announced, the cap is {max_bytes}"
                        )
                    buf = bytearray()
                    for chunk in resp.iter_raw(CHUNK):
                        if len(buf) + len(chunk) > max_bytes:
                            raise FetchError(
                                "too_large", f"GET {url}: more than the cap of {max_bytes} bytes"
                            )
                        buf += chunk
                        if time.monotonic() - started > policy.total_timeout_s:
                            raise FetchError("unreachable", f"GET {url}: too slow", retryable=True)
                    return bytes(buf)
            except FetchError as exc:
                last = exc
                if not exc.retryable:
                    raise
            except httpx.HTTPError as exc:
                last = FetchError("unreachable", f"GET {url}: {type(exc).__name__}: {exc}", retryable=True)
                if watchdog.fired:
                    last = FetchError(
                        "unreachable",
                        f"GET {url}: not finished within {policy.total_timeout_s:g} s",
                        retryable=True,
                    )
            finally:
                watchdog.close()
            if attempt + 1 < policy.attempts:
                time.sleep(policy.backoff(attempt))
    raise last  # type: ignore[misc]


# --- who a download counts against ----------------------------------------------------------------


def _canonical_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as one spelling: an IPv6 form that carries an IPv4 address is that address."""
    found = embedding(ip)
    if found is not None and found[0] in ("IPv4-mapped", "IPv4-translated (SIIT)", "IPv4-compatible"):
        ip = found[1]
    return str(ip) if ip.version == 4 else f"[{ip.compressed}]"


def endpoint_owners(url: str, known: Callable[[str], Iterable[str]] | None = None) -> tuple[str, ...]:
    """The owner keys of the server `url` names, one spelling each: `endpoint:<host>:<port>` with
    the host lower-cased, without its trailing dot, in IDNA form, an IP literal in one notation and
    the default port explicit; then `addr:<ip>:<port>` for each address the host is `known` (a
    name's last lookup, see node.egress.ResolverSlots.known) or written to be. () for a URL with
    no host (the fetch refuses it; its job still counts by miner)."""
    try:
        target = httpx.URL(url)
        host = target.raw_host.decode("ascii").strip("[]").lower().rstrip(".")
    except (httpx.InvalidURL, UnicodeError, ValueError):
        return ()
    if not host or target.scheme not in ("http", "https"):
        return ()
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        literal = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        literal = None
    if literal is not None:
        name = _canonical_ip(literal)
        return (f"endpoint:{name}:{port}", f"addr:{name}:{port}")
    addrs: list[str] = []
    for a in known(host) if known is not None else ():
        try:
            key = f"addr:{_canonical_ip(ipaddress.ip_address(a))}:{port}"
        except ValueError:
            continue
        if key not in addrs:
            addrs.append(key)
    return (f"endpoint:{host[:253]}:{port}", *sorted(addrs)[:16])


# --- the openings folder --------------------------------------------------------------------------


class OpeningsFull(Exception):
    """The openings folder is at its quota or its disk at its reserve: no new download now.
    The node's own condition, not the miner's: the job waits and is never refused for it."""


class ShareFull(OpeningsFull):
    """One miner's downloads hold its share of the openings folder: that miner's next download
    waits (for its own files to be removed when their challenges resolve); no other miner's does."""


def _challenge_of(name: str) -> str:
    return name.split(".", 1)[0]


@dataclass(frozen=True)
class OpeningsStore:
    """The folder downloads go to (its own volume where the operator gives one), with a quota on
    what it holds and a reserve of free space it never eats into. `miner_share` is the part of
    the capacity (the quota, or without one what the disk can give above its reserve) one
    miner's downloads may hold together (`for_miner`)."""

    path: Path
    quota_bytes: int = 0  # 0: no quota (the reserve still applies)
    reserve_bytes: int = 0
    miner_share: float = 1.0
    # Downloads in progress: their file -> (owner, the size they were given room for).
    _pending: dict[str, tuple[str, int]] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.miner_share <= 1:
            raise ValueError(f"openings store: miner_share must be in (0, 1], got {self.miner_share}")

    def for_miner(self, owner: str, challenges: Iterable[str]) -> MinerShare:
        """This store as one miner's download sees it: `challenges` are the hex ids of that miner's
        challenges whose files may be here (they count against its share)."""
        return MinerShare(self, owner, frozenset(challenges))

    def sizes(self) -> dict[str, int]:
        """Bytes held per challenge id (openings, leaf lists and partial files together)."""
        out: dict[str, int] = {}
        for folder in (self.path, self.path / "leaves"):
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        cid = _challenge_of(entry.name)
                        out[cid] = out.get(cid, 0) + entry.stat(follow_symlinks=False).st_size
                except OSError:
                    pass  # removed meanwhile
        return out

    def capacity(self) -> int:
        """What the folder may hold: the quota, or what it holds plus the disk's free space above the
        reserve."""
        if self.quota_bytes:
            return self.quota_bytes
        st = os.statvfs(self.path)
        return max(0, self.used() + st.f_bavail * st.f_frsize - self.reserve_bytes)

    def used(self) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass  # removed meanwhile
        return total

    def room(self, incoming: int) -> None:
        """Raise OpeningsFull unless `incoming` more bytes fit under the quota and above the reserve."""
        if self.quota_bytes:
            used = self.used()
            if used + incoming > self.quota_bytes or used >= self.quota_bytes:
                raise OpeningsFull(
                    f"openings folder {self.path} holds {used} bytes; {incoming} more would pass "
                    f"its quota of {self.quota_bytes} (node.openings_quota_bytes)"
                )
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize
        if free - incoming < self.reserve_bytes:
            raise OpeningsFull(
                f"the disk of {self.path} has {free} bytes free; {incoming} more would pass its "
                f"reserve of {self.reserve_bytes} (node.openings_reserve_bytes)"
            )

    def room_for(self, file: str | os.PathLike[str]) -> Callable[[int], None]:
        """`room` as one file's download asks it (fetch_to_file's `room` callback)."""
        return self.room

    def prune(self, keep: set[str]) -> int:
        """Remove the downloads (openings, leaf lists, partial files) of every challenge whose hex id
        is not in `keep`; the count. Other files are left alone."""
        removed = 0
        for folder in (self.path, self.path / "leaves"):
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if not entry.is_file() or not entry.name.endswith((".opening", ".cbor", ".part")):
                    continue
                if entry.name.split(".", 1)[0] not in keep:
                    entry.unlink(missing_ok=True)
                    removed += 1
        return removed


@dataclass
class MinerShare:
    """One miner's view of the openings store: `room` checks the store's quota and reserve, then
    the miner's share. A file that alone needs more than the share is refused (FetchError
    too_large: no room will ever come); one that fits alone but not beside the miner's other
    files raises ShareFull (the job waits). Each file given room is reserved at its full size
    until `release`, so that one miner's downloads running at once cannot pass the share together."""

    store: OpeningsStore
    owner: str
    challenges: frozenset[str]
    _mine: set[str] = field(default_factory=set)

    @property
    def path(self) -> Path:
        return self.store.path

    def share_bytes(self) -> int:
        return int(self.store.miner_share * self.store.capacity())

    def room(self, incoming: int, file: str | os.PathLike[str] | None = None) -> None:
        """Raise unless `incoming` more bytes of `file` (a path in the store) fit; reserve them."""
        self.store.room(incoming)
        if self.store.miner_share >= 1:
            return
        capacity = self.store.capacity()
        share = int(self.store.miner_share * capacity)
        key = str(file) if file is not None else ""
        with self.store._lock:
            sizes = self.store.sizes()
            held: dict[str, int] = {}  # per file-or-challenge: what it holds or was given room for
            for cid, n in sizes.items():
                if cid in self.challenges:
                    held[cid] = n
            for f, (owner, n) in self.store._pending.items():
                if owner == self.owner:
                    cid = _challenge_of(Path(f).name)
                    held[cid] = max(held.get(cid, 0), n) if f != key else held.get(cid, 0)
            this_cid = _challenge_of(Path(key).name) if key else ""
            this = (held.pop(this_cid, 0) if this_cid else 0) + incoming
            if this > share:
                raise FetchError(
                    "too_large",
                    f"{this} bytes for one challenge of {self.owner}, over the {share} "
                    f"bytes one miner's downloads may hold (node.openings_miner_share "
                    f"{self.store.miner_share:g} of {capacity})",
                )
            others = sum(held.values())
            if others + this > share:
                raise ShareFull(
                    f"{self.owner}'s downloads hold {others} bytes; {this} more would pass its share of "
                    f"{share} bytes of the openings folder (node.openings_miner_share)"
                )
            if key:
                self.store._pending[key] = (self.owner, this)
                self._mine.add(key)

    def room_for(self, file: str | os.PathLike[str]) -> Callable[[int], None]:
        """`room` for one file, as fetch_to_file's `room` callback."""
        return lambda n: self.room(n, file)

    def release(self) -> None:
        """Drop this view's reservations (its downloads ended; their files count as they are)."""
        with self.store._lock:
            for key in self._mine:
                self.store._pending.pop(key, None)
            self._mine.clear()


__all__ = [
    "KINDS",
    "FetchError",
    "FetchPolicy",
    "FetchStopped",
    "MinerShare",
    "OpeningsFull",
    "OpeningsStore",
    "ShareFull",
    "SizeGate",
    "endpoint_owners",
    "fetch_bytes",
    "fetch_to_file",
    "resolve_uri",
]
