"""The stand-in's group without torch (K3SIM_GROUP=tcp): the Gloo group's join, barriers and heartbeat over plain
TCP, for runs that start many stand-in nodes to test what surrounds the engine (launchers, supervision, status,
validate), not Gloo. Importing torch costs a node about 3 s of CPU (2.9 s user + 0.2 s sys measured on this
project's 2-core test machine), more than everything else the node does in most tests.

It keeps the Gloo group's contract (rendezvous.NodeGroup): rank 0 listens on the init_method's port as torch's
TCPStore does, the others connect and retry until the timeout; an all_reduce checks that every rank came; a dead
peer is noticed by the heartbeat. Its failures read as torch's and Gloo's own messages for the same events (the
text of the exceptions below is theirs), so the lines an engine logs, and what k3deploy makes of them, are the same.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import time
from collections.abc import Callable

from k3deploy.sim.rendezvous import HEAD_SILENCE_S, HEARTBEAT_INTERVAL_S, WORKER_SILENCE_S, NodeGroup
from k3deploy.sim.serve_config import Rendezvous

CONNECT_RETRY_S = 0.1
SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


class DistNetworkError(RuntimeError):
    """torch.distributed.DistNetworkError: the client could not reach rank 0's store."""


class DistStoreError(RuntimeError):
    """torch.distributed.DistStoreError: rank 0's store gave up waiting for the other ranks."""


def interface_address(ifname: str, ipv6: bool) -> str | None:
    """The IPv4 address of a network interface to connect from (None for IPv6: the route picks it), or Gloo's
    error when the interface has no address (as a wrong GLOO_SOCKET_IFNAME fails)."""
    try:
        if ipv6:
            socket.if_nametoindex(ifname)
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
    except OSError:
        raise RuntimeError(
            "[enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. "
            f"Unable to find address for: {ifname}"
        ) from None
    return socket.inet_ntoa(packed[20:24])


class Peer:
    """One connection of the group: newline-framed `op value` messages, each read bounded by a timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        host, port = sock.getpeername()[:2]
        self.where = f"[{host}]:{port}"
        self._buffer = b""

    def send(self, op: str, value: float) -> None:
        try:
            self.sock.sendall(f"{op} {value!r}\n".encode())
        except OSError:
            raise RuntimeError(f"Connection closed by peer {self.where}") from None

    def recv(self, op: str, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"Timed out waiting {timeout_s * 1000:.0f}ms for recv operation to complete")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                raise RuntimeError(f"Connection closed by peer {self.where}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        got, _, value = line.decode().partition(" ")
        if got != op:
            raise RuntimeError(f"group protocol: expected {op!r} from {self.where}, got {got!r}")
        return float(value)

    def close(self) -> None:
        self.sock.close()


class SocketGroup(NodeGroup):
    """This node's membership over plain TCP: the head holds one connection to each other node."""

    label = "tcp (K3SIM_GROUP=tcp, no torch)"

    def __init__(self, rdv: Rendezvous) -> None:
        super().__init__(rdv)
        self._peers: dict[int, Peer] = {}

    def load(self) -> None:
        """Nothing to import."""

    def join(self) -> float:
        rdv = self.rdv
        if rdv.nnodes == 1:
            return 1.0
        deadline = time.monotonic() + rdv.timeout_s
        source = interface_address(self.ifname, ":" in rdv.host) if self.ifname != "unset" else None
        if rdv.node_rank == 0:
            self._accept_all(deadline)
            total = 1.0 + sum(peer.recv("sum", self._left(deadline)) for peer in self._peers.values())
            for peer in self._peers.values():
                peer.send("total", total)
            return total
        head = self._connect(deadline, source)
        self._peers[0] = head
        head.send("rank", rdv.node_rank)
        head.send("sum", float(rdv.node_rank + 1))
        return head.recv("total", self._left(deadline))

    def barrier(self, status: int, timeout_s: float) -> int:
        if self.rdv.nnodes == 1:
            return status
        if self.rdv.node_rank == 0:
            worst = max([float(status)] + [p.recv("max", timeout_s) for p in self._peers.values()])
            for peer in self._peers.values():
                peer.send("max_total", worst)
            return int(worst)
        head = self._peers[0]
        head.send("max", float(status))
        return int(head.recv("max_total", timeout_s))

    def _beat_head(self, on_lost: Callable[[int, str], None], deadline: float) -> None:
        while time.monotonic() < deadline:
            for rank, peer in sorted(self._peers.items()):
                try:
                    peer.recv("beat", WORKER_SILENCE_S)
                    peer.send("beat", 0.0)
                except RuntimeError as exc:
                    on_lost(rank, f"RuntimeError: {exc}")
                    return
            time.sleep(HEARTBEAT_INTERVAL_S)

    def _beat_worker(self, on_lost: Callable[[int, str], None], deadline: float) -> None:
        head = self._peers[0]
        while time.monotonic() < deadline:
            try:
                head.send("beat", 0.0)
                head.recv("beat", HEAD_SILENCE_S)
            except RuntimeError as exc:
                on_lost(0, f"RuntimeError: {exc}")
                return

    @staticmethod
    def _left(deadline: float) -> float:
        return max(deadline - time.monotonic(), 0.1)

    def _accept_all(self, deadline: float) -> None:
        """Rank 0: listen where TCPStore would (every address, the init_method's port) until all ranks came."""
        rdv = self.rdv
        family = socket.AF_INET6 if ":" in rdv.host else socket.AF_INET
        server = socket.create_server(("", rdv.port), family=family, backlog=rdv.nnodes)
        try:
            while len(self._peers) < rdv.nnodes - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistStoreError(
                        f"Timed out after {rdv.timeout_s:.0f} seconds waiting for clients. "
                        f"{len(self._peers) + 1}/{rdv.nnodes} clients joined."
                    )
                server.settimeout(left)
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                peer = Peer(conn)
                try:
                    rank = int(peer.recv("rank", self._left(deadline)))
                except RuntimeError:
                    peer.close()  # not one of ours, or gone before saying who it is
                    continue
                self._peers[rank] = peer
        finally:
            server.close()

    def _connect(self, deadline: float, source: str | None) -> Peer:
        """A worker: connect to rank 0, retrying as TCPStore's client does until the timeout."""
        rdv = self.rdv
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistNetworkError(
                    f"The client socket has timed out after {rdv.timeout_s:.0f}s while trying to connect to "
                    f"({rdv.host}, {rdv.port})."
                )
            try:
                sock = socket.create_connection(
                    (rdv.host, rdv.port), timeout=min(left, 5.0),
                    source_address=(source, 0) if source else None,
                )
            except OSError:
                time.sleep(min(CONNECT_RETRY_S, max(left, 0)))
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Peer(sock)
