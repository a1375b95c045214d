"""Where the node's downloads may go: a miner names the URL, so every address it resolves to is
checked before any connection, and the connection goes to that checked address (the name stays in
the Host header and TLS SNI). Loopback, private, link-local, metadata, multicast, reserved and
their IPv6 forms are refused unless the operator's allow-list opens them.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

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
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_6TO4 = ipaddress.ip_network("2002::/16")


class EgressRefused(Exception):
    """A URL whose host may not be fetched, or did not resolve; `reason` is for the node's log only."""

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable  # a name that did not resolve may resolve later; a refused address not


def embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, NAT64 well-known prefix, 6to4), if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip in _MAPPED or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _6TO4:
        return ipaddress.IPv4Address((int(ip) >> 80) & 0xFFFFFFFF)
    return None


def forbidden(ip: IPAddress) -> str | None:
    """Why `ip` is refused by default (a short name), or None for a globally routable address."""
    v4 = embedded_v4(ip)
    if v4 is not None:
        inner = forbidden(v4)
        return None if inner is None else f"{inner} (as {ip})"
    for net, why in _BLOCKED:
        if ip.version == net.version and ip in net:
            return why
    if not ip.is_global:  # a backstop for ranges the table does not name
        return "not globally routable"
    return None


def parse_allow(entries: Iterable[str]) -> tuple[tuple[IPNetwork, ...], frozenset[str]]:
    """Split allow-list entries into networks (an address or a CIDR) and host names; ValueError names a bad one."""
    nets: list[IPNetwork] = []
    names: set[str] = set()
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        name = entry.lower().rstrip(".")
        if not name or len(name) > 253 or not all(c.isalnum() or c in "-._" for c in name):
            raise ValueError(f"allow-list entry {entry[:80]!r} is neither an address, a CIDR network nor a host name")
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


_DNS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pot-dns")


@dataclass(frozen=True)
class EgressPolicy:
    """The allow-list (networks and host names) and the resolver; `resolve` gives checked addresses."""

    allow_networks: tuple[IPNetwork, ...] = ()
    allow_hosts: frozenset[str] = frozenset()
    resolver: Resolver = system_resolver
    dns_timeout_s: float = 5.0

    @classmethod
    def from_allow(cls, entries: Iterable[str], **kw) -> EgressPolicy:
        nets, names = parse_allow(entries)
        return cls(nets, names, **kw)

    def _allowed(self, ip: IPAddress) -> bool:
        candidates = [ip] + ([v] if (v := embedded_v4(ip)) is not None else [])
        return any(c.version == n.version and c in n for c in candidates for n in self.allow_networks)

    def check_address(self, ip: IPAddress, host: str) -> None:
        why = forbidden(ip)
        if why is not None and not self._allowed(ip):
            raise EgressRefused(f"{host[:100]} resolves to {ip}, a {why} address outside the allow-list")

    def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The addresses to connect to for `host`: every one checked, or EgressRefused (nothing connected)."""
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
            addrs = _DNS.submit(self.resolver, name, port).result(timeout=self.dns_timeout_s)
        except FutureTimeout:
            raise EgressRefused(f"{name[:100]} did not resolve within {self.dns_timeout_s:g} s",
                                retryable=True) from None
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


__all__ = ["EgressPolicy", "EgressRefused", "embedded_v4", "forbidden", "parse_allow", "system_resolver"]
