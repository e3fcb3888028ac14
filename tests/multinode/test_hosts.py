"""The test-host fixture itself: hosts reach each other over TCP through the bridge, the
kernel counts the bytes, tbf caps the rate, and nothing is left behind."""

from __future__ import annotations

import subprocess
import sys
import time

from phalanx.runtime.hosts import (
    PREFIX,
    TCP_CONGESTION,
    TestNetwork,
    congestion_control,
    remove_stale,
)

# inside a test host every port is free: the namespace has its own port space
PORT = 5001
SERVER = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.sendall(b"x" * int(sys.argv[3])); c.close()
"""


def _transfer(net: TestNetwork, nbytes: int) -> tuple[int, float]:
    """Send ``nbytes`` from host 0 to host 1; (bytes received, seconds) as host 1 saw them."""
    h0, h1 = net.hosts[:2]
    server = h1.popen([sys.executable, "-c", SERVER, h1.addr, str(PORT)],
                      stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    h0.run([sys.executable, "-c", CLIENT, h1.addr, str(PORT), str(nbytes)], check=True,
           timeout=60)
    got, seconds = server.communicate(timeout=60)[0].split()
    return int(got), float(seconds)


def test_hosts_talk_and_the_kernel_counts_the_bytes(network) -> None:
    net = network(2)
    h0, h1 = net.hosts
    assert h0.addr != h1.addr and h0.addr.rsplit(".", 1)[0] == h1.addr.rsplit(".", 1)[0]
    before = h0.tx_bytes(), h1.rx_bytes()
    got, _ = _transfer(net, 4_000_000)
    assert got == 4_000_000
    sent, received = h0.tx_bytes() - before[0], h1.rx_bytes() - before[1]
    # payload + TCP/IP headers (~3% at 1500-byte frames), nothing else on the link
    assert 4_000_000 <= sent <= 4_000_000 * 1.06, sent
    assert 4_000_000 <= received <= 4_000_000 * 1.06, received


CC = "x.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(bytes(1)).decode()"
CC_SERVER = f"""
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
x, _ = s.accept(); print({CC}, flush=True); x.recv(1)
"""
CC_CLIENT = f"""
import socket, sys
x = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30); print({CC})
"""


def _ends(net: TestNetwork) -> tuple[str, str]:
    """The congestion control of each end of a connection from host 0 to host 1."""
    h0, h1 = net.hosts[:2]
    server = h1.popen([sys.executable, "-c", CC_SERVER, h1.addr, str(PORT)],
                      stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    client = h0.run([sys.executable, "-c", CC_CLIENT, h1.addr, str(PORT)], check=True,
                    timeout=30).stdout
    return client.strip(), server.communicate(timeout=30)[0].strip()


def test_tcp_between_test_hosts_runs_cubic_whatever_the_machine_s_default(network) -> None:
    """This machine's default is BBR, whose estimate collapses now and then on a tbf link
    (hosts.py): both ends of a connection between test hosts run CUBIC, or what the
    network was asked for (``phalanx scale steps --tcp``)."""
    assert congestion_control() == TCP_CONGESTION == "cubic"  # the kernel has it here
    assert _ends(network(2)) == ("cubic", "cubic")
    assert _ends(network(2, tcp="reno")) == ("reno", "reno")


def test_tbf_caps_the_rate_and_listening_sockets_are_seen(network) -> None:
    net = network(2, rate_mbit=20)
    h1 = net.hosts[1]
    server = h1.popen([sys.executable, "-c", SERVER, h1.addr, str(PORT)],
                      stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    assert [(x.addr, x.port) for x in h1.listening()] == [(h1.addr, PORT)]
    assert h1.listening()[0].pid == server.pid or "-c" in h1.listening()[0].cmdline
    assert net.hosts[0].listening() == []
    server.kill()
    server.wait()
    got, seconds = _transfer(net, 3_000_000)
    mbit = got * 8 / seconds / 1e6
    print(f"tbf 20 Mbit/s: measured {mbit:.1f} Mbit/s")
    # an upper bound only (a loaded machine can be slower, never faster than the bucket)
    assert mbit <= 20 * 1.25


def test_teardown_and_stale_cleanup() -> None:
    from hosts import unavailable

    reason = unavailable()
    if reason is not None:
        import pytest
        pytest.skip(reason)
    with TestNetwork(2) as net:
        names = [h.name for h in net.hosts]
        sleeper = net.hosts[0].popen(["sleep", "600"])
        time.sleep(0.2)
    sleeper.wait(timeout=10)  # teardown ended what ran inside
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listing for n in names)
    # a namespace left by a dead process (pid 2**22 + 1 is above pid_max's default range)
    stale = f"{PREFIX}{2**22 + 1}-dead-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in remove_stale()
