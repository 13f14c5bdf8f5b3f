"""Tests of the multi-host rig's networks: private traffic on the private NICs, a cut link, the controller
namespace on the management network only, and the SSH executor's sockets over it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.rig import HostRig

pytestmark = pytest.mark.integration


SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5123)); s.listen(1); s.settimeout(15)
c, _ = s.accept(); c.settimeout(15); n = 0
while True:
    b = c.recv(1 << 16)
    if not b: break
    n += len(b)
print(n)
"""
CLIENT = """
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 5123), timeout=5); break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("server never listened")
c.sendall(b"x" * int(sys.argv[2])); c.close()
"""


@pytest.mark.timeout(60)
def test_private_traffic_shows_on_ens_priv_counters(rig4: HostRig) -> None:
    a, b = rig4.host("h01"), rig4.host("h02")
    size = 4 << 20
    before = {(h.name, i): rig4.iface_bytes(h, i) for h in (a, b) for i in (h.priv_iface, h.mgmt_iface)}
    result: dict[str, subprocess.CompletedProcess[str]] = {}
    server = threading.Thread(
        target=lambda: result.update(s=rig4.exec(b, [sys.executable, "-c", SERVER, b.priv_ip], 30))
    )
    server.start()
    sent = rig4.exec(a, [sys.executable, "-c", CLIENT, b.priv_ip, str(size)], 30)
    server.join(timeout=30)
    assert sent.returncode == 0, sent.stderr
    assert result["s"].stdout.strip() == str(size), result["s"].stderr
    after = {key: rig4.iface_bytes(*key) for key in before}
    delta = {key: (after[key][0] - before[key][0], after[key][1] - before[key][1]) for key in before}
    assert delta[("h01", "ens-priv")][1] >= size  # tx on the sender's private NIC
    assert delta[("h02", "ens-priv")][0] >= size  # rx on the receiver's private NIC
    assert delta[("h01", "ens-mgmt")][1] < 64 << 10
    assert delta[("h02", "ens-mgmt")][0] < 64 << 10


def _port_open(ip: str, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=timeout_s):
            return True
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_set_link_down_cuts_one_network(rig4: HostRig) -> None:
    host = rig4.host("h03")
    rig4.set_link(host, host.priv_iface, up=False)
    try:
        assert not _port_open(host.priv_ip)
        assert _port_open(host.mgmt_ip)
    finally:
        rig4.set_link(host, host.priv_iface, up=True)
    deadline = time.monotonic() + 5
    while not _port_open(host.priv_ip) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _port_open(host.priv_ip)


@pytest.mark.timeout(60)
def test_ssh_executor_sockets_send_at_once_and_ack_at_once(rig4: HostRig) -> None:
    """Without these, sshd's reply to the first channel open waits out our delayed ACK (40 ms per stall)."""
    from k3deploy.executors import SshTarget, open_executor
    from k3deploy.executors.tcp import QuickAckSocket

    host = rig4.hosts[1]
    ex = open_executor(SshTarget(host=host.name, ssh_config=str(rig4.ssh_config_path),
                                  known_hosts=str(rig4.known_hosts_path)))
    try:
        assert ex.run("hostname").stdout.strip() == host.name
        sock = ex._client.get_transport().sock  # type: ignore[attr-defined]
        assert isinstance(sock, QuickAckSocket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert sock.getpeername() == (host.mgmt_ip, 22)
    finally:
        ex.close()


@pytest.mark.timeout(60)
def test_controller_namespace_reaches_management_addresses_only(rig4: HostRig) -> None:
    ns = rig4.controller()
    assert rig4.controller() == ns  # made once
    code = ("import socket, sys\n"
            "def reach(ip):\n"
            "    try:\n"
            "        socket.create_connection((ip, 22), timeout=2).close(); return 'open'\n"
            "    except OSError as e:\n"
            "        return type(e).__name__\n"
            "print(reach(sys.argv[1]), reach(sys.argv[2]))\n")
    host = rig4.hosts[2]
    run = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, host.mgmt_ip, host.priv_ip],
                         capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    mgmt, priv = run.stdout.split()
    assert mgmt == "open" and priv == "OSError", run.stdout  # ENETUNREACH: no route at all, nothing sent
