"""TCP sockets for SSH connections: Nagle off, and every segment acknowledged at once."""
from __future__ import annotations

import socket


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges every segment at once.

    After authentication sshd sends its host-key announcement and, right behind it, the reply to our first
    channel open; with Nagle on (sshd only disables it for interactive sessions) that reply waits for our
    ACK of the first, which Linux delays by 40 ms. Twice per connection (auth, first session) that was 80 ms
    of a ~125 ms connect+command on a LAN. Quick-ack mode is not sticky, so it is re-armed before each read.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if _QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return super().recv(bufsize, flags)


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def open_socket(hostname: str, port: int, timeout_s: float) -> socket.socket:
    """A connected TCP socket (IPv4 or IPv6, first address that answers) with Nagle off and quick ACKs."""
    last: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM):
        sock = QuickAckSocket(family, kind, proto)
        try:
            sock.settimeout(timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address for {hostname}")
