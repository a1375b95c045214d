"""Ports handed to local child processes: one allocation never repeats a port, and a Ray cluster's
allocator never hands out a port twice across its nodes (a repeat made a Ray node refuse to start)."""

from __future__ import annotations

import socket

import pytest

from devnet.procs import free_ports
from devnet.ray_cluster import _Ports


def test_free_ports_are_distinct_and_bindable():
    for _ in range(20):
        ports = free_ports(40)
        assert len(set(ports)) == 40
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free once the allocation returns


def test_free_ports_skip_the_ports_to_avoid():
    first = free_ports(30)
    again = free_ports(30, avoid=set(first))
    assert not set(first) & set(again)


def test_a_clusters_ports_never_repeat_across_its_nodes():
    ports = _Ports()
    seen: list[int] = []
    for _ in range(8):  # the head's address and client port, then a node's twelve, eight times over
        seen += ports.take(2)
        args = ports.node_args()
        seen += [int(a) for a in args[1::2][:6]] + [int(x) for x in args[-1].split(",")]
    assert len(seen) == len(set(seen)) == 8 * 14


@pytest.mark.slow
def test_a_node_that_dies_on_a_port_clash_is_started_again(tmp_path, monkeypatch):
    # The clash CI once met: a worker port equal to the dashboard agent's. Ray refuses to start such
    # a node; the cluster starts it again with fresh ports, and the first try's refusal is in its log.
    from devnet import ray_cluster

    real = ray_cluster._Ports.node_args
    calls = []

    def clashing(self):
        args = real(self)
        calls.append(args)
        if len(calls) == 1:
            agent = args[args.index("--dashboard-agent-listen-port") + 1]
            args[-1] = ",".join([agent, *args[-1].split(",")[1:]])
        return args

    monkeypatch.setattr(ray_cluster._Ports, "node_args", clashing)
    c = ray_cluster.start_cluster(tmp_path, nodes=1, timeout=120)
    try:
        assert len(calls) == 2
        assert ray_cluster.PORT_CLASH in (tmp_path / "ray-head.log").read_text(errors="replace")
        assert c.procs["head"].poll() is None
    finally:
        c.stop()
