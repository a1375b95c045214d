"""Where the node's downloads may go: a miner names the URL, so every address it resolves to is
checked before any connection, and the connection goes to that checked address (the name stays in
the Host header and TLS SNI). Loopback, private, link-local, metadata, multicast, reserved and
their IPv6 forms (every form that embeds an IPv4 address included) are refused unless the
operator's allow-list opens them. Names are looked up on threads shared out per miner
(ResolverSlots): a miner whose names never answer holds its own slots only.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Refused by default, each with the name the node's own log gives it (never shown to a miner).
_V4_BLOCKED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
)
_V6_BLOCKED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard"),
    ("2001::/32", "Teredo"),
    ("2001:db8::/32", "documentation"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
_BLOCKED = tuple((ipaddress.ip_network(n), why) for n, why in _V4_BLOCKED + _V6_BLOCKED)
_net = ipaddress.IPv6Network
# IPv6 prefixes that carry an IPv4 address, with where it sits: "low" (the last 32 bits), "6to4"
# (bits 16-47), "teredo" (the client: the last 32 bits inverted), "rfc6052-48" (bits 48-63 and
# 72-87, around the u octet). A translator or tunnel may deliver such an address to that IPv4 host.
_EMBEDDING: tuple[tuple[ipaddress.IPv6Network, str, str], ...] = (
    (_net("::ffff:0:0/96"), "low", "IPv4-mapped"),
    (_net("::ffff:0:0:0/96"), "low", "IPv4-translated (SIIT)"),
    (_net("64:ff9b::/96"), "low", "NAT64"),
    (_net("64:ff9b:1::/48"), "rfc6052-48", "local-use NAT64"),
    (_net("2002::/16"), "6to4", "6to4"),
    (_net("2001::/32"), "teredo", "Teredo"),
    (_net("::/96"), "low", "IPv4-compatible"),
)
# The forms refused whatever they embed: deprecated or network-specific, no public prover needs them.
_REFUSED_FORMS = frozenset({"IPv4-compatible", "Teredo", "local-use NAT64"})
# Allow-list networks broader than these cover most of the internal space at once (fetch.allow_broad).
MIN_ALLOW_PREFIX = {4: 8, 6: 16}


class EgressRefused(Exception):
    """A URL whose host may not be fetched, or did not resolve; `reason` is for the node's log only."""

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable  # a name that did not resolve may resolve later; a refused address not


def embedding(ip: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    """(the form's name, the IPv4 address) an IPv6 address embeds, if it is of such a form."""
    if (
        isinstance(ip, ipaddress.IPv4Address)
        or ip == ipaddress.IPv6Address("::")
        or ip == ipaddress.IPv6Address("::1")
    ):
        return None
    n = int(ip)
    for net, where, form in _EMBEDDING:
        if ip not in net:
            continue
        if where == "low":
            v4 = n & 0xFFFFFFFF
        elif where == "6to4":
            v4 = (n >> 80) & 0xFFFFFFFF
        elif where == "teredo":
            v4 = ~n & 0xFFFFFFFF
        else:  # rfc6052-48: 16 bits before the u octet (bits 64-71), 16 after it
            v4 = ((n >> 64) & 0xFFFF) << 16 | (n >> 40) & 0xFFFF
        return form, ipaddress.IPv4Address(v4)
    return None


def embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, translated, NAT64, 6to4, Teredo, compatible), if
    any."""
    found = embedding(ip)
    return None if found is None else found[1]


def forbidden(ip: IPAddress) -> str | None:
    """Why `ip` is refused by default (a short name), or None for a globally routable address."""
    found = embedding(ip)
    if found is not None:
        form, v4 = found
        inner = forbidden(v4)
        if inner is not None:
            return f"{inner} (as {form} {ip})"
        if form in _REFUSED_FORMS:
            return f"{form} (embedding {v4})"
        return None  # a public IPv4 host reached through a translator: judged as that host
    for net, why in _BLOCKED:
        if ip.version == net.version and ip in net:
            return why
    if not ip.is_global:  # a backstop for ranges the table does not name
        return "not globally routable"
    return None


def _too_broad(net: IPNetwork) -> str | None:
    """Why an allow-list network opens too much at once, or None."""
    least = MIN_ALLOW_PREFIX[net.version]
    if net.prefixlen < least:
        covered = sorted({why for n, why in _BLOCKED if n.version == net.version and n.subnet_of(net)})  # type: ignore[arg-type]
        return (f"a /{net.prefixlen} network, broader than /{least}: it opens "
                + (", ".join(covered) if covered else "a large part of the address space") + " addresses")
    if net.version == 6:
        for emb, _where, form in _EMBEDDING:
            if emb.subnet_of(net):  # type: ignore[arg-type]
                return f"it covers the whole {form} prefix {emb}, that is every IPv4 address in that form"
    return None


def parse_allow(
    entries: Iterable[str], *, broad: bool = False
) -> tuple[tuple[IPNetwork, ...], frozenset[str]]:
    """Split allow-list entries into networks (an address or a CIDR) and host names; ValueError names a
    bad one.

    A network broader than /8 (IPv4) or /16 (IPv6), or one covering a whole IPv4-embedding IPv6
    prefix, is refused unless `broad` (fetch.allow_broad) says the operator means it.
    """
    nets: list[IPNetwork] = []
    names: set[str] = set()
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        try:
            net = ipaddress.ip_network(entry.strip("[]"), strict=False)
        except ValueError:
            net = None
        if net is not None:
            why = None if broad else _too_broad(net)
            if why is not None:
                raise ValueError(
                    f"allow-list entry {entry[:80]!r} is too broad: {why}; name the networks the "
                    f"provers are on, or set fetch.allow_broad = true to open it anyway"
                )
            nets.append(net)
            continue
        name = entry.lower().rstrip(".")
        if not name or len(name) > 253 or not all(c.isalnum() or c in "-._" for c in name):
            raise ValueError(
                f"allow-list entry {entry[:80]!r} is neither an address, a CIDR network nor a host name"
            )
        names.add(name)
    return tuple(nets), frozenset(names)


Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address getaddrinfo gives for `host` (TCP), in its order, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    out: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        addr = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 scope id is not part of the address
        if addr not in out:
            out.append(addr)
    return out


class ResolverSlots:
    """Where name lookups run: a thread each, at most `per_owner` at once for one owner (a miner)
    and `total` for all owners together, each lookup within its deadline.

    A lookup that has not answered by its deadline is abandoned: its caller gets a retryable
    refusal, and its thread, while it lasts, keeps a slot of its own owner (and of the total),
    never another owner's. An owner whose slots are all held waits for one until its deadline,
    alone. The addresses each name last resolved to are remembered (at most `remember` names), so
    that the scheduler can count two names of one server as one (`known`).
    """

    def __init__(self, per_owner: int = 2, total: int = 64, remember: int = 4096) -> None:
        if per_owner < 1 or total < per_owner:
            raise ValueError(
                f"resolver slots: need 1 <= per_owner <= total, got per_owner={per_owner}, total={total}"
            )
        self.per_owner, self.total, self.remember = per_owner, total, remember
        self._cond = threading.Condition()
        self._busy: dict[str, int] = {}
        self._running = 0
        self._seen: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def __reduce__(self) -> tuple[Any, tuple[int, int, int]]:
        # Slots hold threads and a lock of this process: a policy sent to another process (a
        # cluster worker) gets fresh slots of the same sizes there.
        return (ResolverSlots, (self.per_owner, self.total, self.remember))

    def busy(self, owner: str | None = None) -> int:
        """Lookup threads running (an owner's, or all), abandoned ones included."""
        with self._cond:
            return self._running if owner is None else self._busy.get(owner, 0)

    def known(self, name: str) -> tuple[str, ...]:
        """The addresses `name` (lower case, no trailing dot) last resolved to here; () if none yet."""
        with self._cond:
            return self._seen.get(name, ())

    def _release(self, owner: str) -> None:
        with self._cond:
            self._running -= 1
            n = self._busy.get(owner, 0) - 1
            if n > 0:
                self._busy[owner] = n
            else:
                self._busy.pop(owner, None)
            self._cond.notify_all()

    def lookup(self, owner: str, resolver: Resolver, name: str, port: int, timeout_s: float) -> list[str]:
        """resolver(name, port) on a slot of `owner`, within `timeout_s` in all (the wait for a slot
        included); EgressRefused (retryable) when it does not answer in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._busy.get(owner, 0) >= self.per_owner or self._running >= self.total:
                left = deadline - time.monotonic()
                if left <= 0:
                    held = self._busy.get(owner, 0)
                    why = (
                        f"its miner's {held} lookup slot(s) are all held by lookups still unanswered"
                        if held >= self.per_owner
                        else f"all {self.total} lookup slots of the node are held"
                    )
                    raise EgressRefused(
                        f"{name[:100]} not looked up within {timeout_s:g} s: {why}", retryable=True
                    )
                self._cond.wait(left)
            self._busy[owner] = self._busy.get(owner, 0) + 1
            self._running += 1
        box: dict[str, object] = {}
        done = threading.Event()

        def body() -> None:
            try:
                box["addrs"] = resolver(name, port)
            except BaseException as exc:  # handed to the caller, if it still waits
                box["error"] = exc
            finally:
                self._release(owner)
                done.set()

        try:
            threading.Thread(target=body, daemon=True, name="pot-dns").start()
        except BaseException:
            self._release(owner)
            raise
        if not done.wait(max(0.0, deadline - time.monotonic())):
            raise EgressRefused(f"{name[:100]} did not resolve within {timeout_s:g} s", retryable=True)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        addrs = list(box["addrs"])  # type: ignore[call-overload]
        with self._cond:
            self._seen[name] = tuple(str(a) for a in addrs)
            self._seen.move_to_end(name)
            while len(self._seen) > self.remember:
                self._seen.popitem(last=False)
        return addrs


# One set of slots for the whole process: every policy shares it unless given its own.
DEFAULT_SLOTS = ResolverSlots()


@dataclass(frozen=True)
class EgressPolicy:
    """The allow-list (networks and host names) and the resolver; `resolve` gives checked addresses."""

    allow_networks: tuple[IPNetwork, ...] = ()
    allow_hosts: frozenset[str] = frozenset()
    resolver: Resolver = system_resolver
    dns_timeout_s: float = 5.0
    slots: ResolverSlots = field(default=DEFAULT_SLOTS, compare=False)

    @classmethod
    def from_allow(cls, entries: Iterable[str], *, broad: bool = False, **kw) -> EgressPolicy:
        nets, names = parse_allow(entries, broad=broad)
        return cls(nets, names, **kw)

    def _allowed(self, ip: IPAddress) -> bool:
        # A translated form is opened by its IPv4 address; the forms refused whole only by their own.
        found = embedding(ip)
        candidates = [ip] + ([found[1]] if found is not None and found[0] not in _REFUSED_FORMS else [])
        return any(c.version == n.version and c in n for c in candidates for n in self.allow_networks)

    def check_address(self, ip: IPAddress, host: str) -> None:
        why = forbidden(ip)
        if why is not None and not self._allowed(ip):
            raise EgressRefused(f"{host[:100]} resolves to {ip}, a {why} address outside the allow-list")

    def resolve(self, host: str, port: int, owner: str = "") -> list[IPAddress]:
        """The addresses to connect to for `host`: every one checked, or EgressRefused (nothing connected).
        The lookup runs on a slot of `owner` (the miner whose URL it is; "" for unattributed)."""
        name = host.strip("[]").lower().rstrip(".")
        try:
            literal: IPAddress | None = ipaddress.ip_address(name.split("%", 1)[0])
        except ValueError:
            literal = None
        if literal is not None:
            self.check_address(literal, name)
            return [literal]
        checked = name not in self.allow_hosts  # the operator trusts an allowed name wherever it points
        try:
            addrs = self.slots.lookup(owner, self.resolver, name, port, self.dns_timeout_s)
        except (OSError, UnicodeError) as exc:
            raise EgressRefused(f"{name[:100]} does not resolve: {exc}", retryable=True) from None
        ips = []
        for a in addrs:
            try:
                ips.append(ipaddress.ip_address(a))
            except ValueError:
                raise EgressRefused(f"{name[:100]} resolved to {a[:60]!r}, not an address") from None
        if not ips:
            raise EgressRefused(f"{name[:100]} resolves to no address")
        if checked:
            for ip in ips:  # one forbidden answer refuses the name: a rebinding host mixes them
                self.check_address(ip, name)
        return ips


__all__ = [
    "DEFAULT_SLOTS",
    "MIN_ALLOW_PREFIX",
    "EgressPolicy",
    "EgressRefused",
    "ResolverSlots",
    "embedded_v4",
    "embedding",
    "forbidden",
    "parse_allow",
    "system_resolver",
]
