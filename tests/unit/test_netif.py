"""The gloo interface choice and the lost-node line: pure logic on this machine's interfaces."""

from __future__ import annotations

import socket

import pytest

from phalanx.errors import PhalanxError
from phalanx.runtime import netif
from phalanx.runtime.nodes import NodeTable, RankPlace


def _own_addr() -> str:
    addr = next((a for a in netif.local_addrs() if not a.startswith("127.")), None)
    if addr is None:
        pytest.skip("no non-loopback IPv4 interface here")
    return addr


def test_single_host_binds_loopback_for_a_loopback_or_foreign_master() -> None:
    # a foreign master under torchrun's agent: the group's own store is rank 0's, on lo
    for master in ("10.1.2.3", "127.0.0.1"):
        b = netif.choose(master, multi_host=False)
        assert (b.iface, b.addr, b.reason) == ("lo", "127.0.0.1", "single host")


def test_single_host_with_a_master_of_this_host_binds_its_interface() -> None:
    # issue 33: Ray hands out the node's address even when every rank is on this host; the
    # group meets there (phalanx schedule), so every rank binds it
    addr = _own_addr()
    for serves in (False, True):
        b = netif.choose(addr, multi_host=False, at_master=True, serves=serves)
        assert b.addr == addr and netif.iface_addr(b.iface) == addr and b.iface != "lo"
    # under torchrun's agent the group's own store is published there: loopback
    b = netif.choose(addr, multi_host=False)
    assert (b.iface, b.addr) == ("lo", "127.0.0.1")


def test_rank_0_handed_a_foreign_master_is_a_one_line_error() -> None:
    with pytest.raises(PhalanxError, match=r"^rank 0 serves the group at MASTER_ADDR 10\.1\.2"
                       r"\.3 \(10\.1\.2\.3\), which is not an address of this host \(have "):
        netif.choose("10.1.2.3", multi_host=False, serves=True)
    with pytest.raises(PhalanxError, match=r"^--iface lo \(127\.0\.0\.1\) is not MASTER_ADDR"):
        netif.choose(_own_addr(), multi_host=False, iface="lo", serves=True)


def test_iface_flag_beats_the_environment_and_the_route() -> None:
    b = netif.choose("127.0.0.1", multi_host=True, iface="lo", env_iface="nope0")
    assert (b.iface, b.addr, b.reason) == ("lo", "127.0.0.1", "--iface")
    b = netif.choose("127.0.0.1", multi_host=True, env_iface="lo")
    assert b.reason == "GLOO_SOCKET_IFNAME"


def test_unknown_interface_is_a_one_line_error() -> None:
    with pytest.raises(PhalanxError, match=r"^--iface 'nope0': no such interface here \(have "):
        netif.choose("127.0.0.1", multi_host=True, iface="nope0")


def test_multi_host_with_a_loopback_master_says_what_to_change() -> None:
    with pytest.raises(PhalanxError, match="loopback .*--local-addr"):
        netif.choose("localhost", multi_host=True)


def test_route_to_a_local_address_is_its_interface() -> None:
    # the interface that routes to one of this machine's own addresses holds that address
    names = [n for _, n in socket.if_nameindex() if netif.iface_addr(n)
             and n != "lo" and not netif.iface_addr(n).startswith("127.")]
    if not names:
        pytest.skip("no non-loopback IPv4 interface here")
    addr = netif.iface_addr(names[0])
    b = netif.choose(addr, multi_host=True)
    assert b.addr == addr and netif.iface_addr(b.iface) == addr


def test_failure_line_names_the_node_behind_the_address() -> None:
    table = NodeTable((RankPlace(0, 0, "10.0.0.1"), RankPlace(1, 0, "10.0.0.1"),
                       RankPlace(2, 1, "10.0.0.2"), RankPlace(3, 1, "10.0.0.2")))
    e = RuntimeError("[/x/gloo/pair.cc:537] Read error [10.0.0.2]:9963: Connection reset by "
                     "peer. This is typically caused by a remote worker crashing. GLHF!")
    line = table.failure_line(1, e)
    assert line == ("lost node 1 (10.0.0.2, ranks 2-3): rank 1 on node 0 saw: Read error "
                    "[10.0.0.2]:9963: Connection reset by peer")
    # an address of our own node does not blame anyone
    own = table.failure_line(0, RuntimeError("Connection closed by peer [10.0.0.1]:35244"))
    assert own.startswith("rank 0 on node 0 failed: ")
