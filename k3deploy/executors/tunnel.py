"""A local TCP port forwarded through an SSH connection: each accepted connection becomes one channel the
node opens (direct-tcpip), so a login node reaches rank 0's private or loopback ports through its sshd."""
from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from typing_extensions import Self

LISTEN_BACKLOG = 64
CHUNK_BYTES = 65536
log = logging.getLogger(__name__)


class Tunnel:
    """Listens on 127.0.0.1:<ephemeral>; `open_channel(peer)` makes the node-side half of a connection."""

    def __init__(self, open_channel: Callable[[tuple[str, int]], Any], label: str) -> None:
        self.label = label
        self._open_channel = open_channel
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=LISTEN_BACKLOG)
        self.local_host, self.local_port = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[Any] = set()
        self.last_failure: str | None = None  # why the last channel could not be opened (the client saw a reset)
        threading.Thread(target=self._accept, daemon=True, name=f"k3tun-{self.local_port}").start()

    def _accept(self) -> None:
        for _ in range(10**9):  # until close() shuts the listener
            try:
                client, peer = self._listener.accept()
            except OSError:
                return
            if self._closed.is_set():
                client.close()
                return
            threading.Thread(target=self._pair, args=(client, peer), daemon=True).start()

    def _pair(self, client: socket.socket, peer: tuple[str, int]) -> None:
        try:
            chan = self._open_channel(peer)
        except Exception as exc:  # noqa: BLE001 - the client sees a closed connection; we log and keep why
            self.last_failure = f"no channel {self.label}: {type(exc).__name__}: {exc}"
            log.debug("tunnel %s: cannot open a channel: %s", self.label, exc)
            client.close()
            return
        with self._lock:
            self._open.update((client, chan))
        try:
            _pump(client, chan, self._closed)
        finally:
            with self._lock:
                self._open.difference_update((client, chan))
            chan.close()
            client.close()

    def close(self) -> None:
        """Stop accepting and end every forwarded connection."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._listener.close()
        with self._lock:
            ends = list(self._open)
        for end in ends:
            try:
                end.close()
            except OSError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pump(client: socket.socket, chan: Any, closed: threading.Event) -> None:
    """Copy bytes both ways until either side closes (or the tunnel does)."""
    for _ in range(10**9):
        if closed.is_set():
            return
        try:
            ready, _, _ = select.select([client, chan], [], [], 0.5)
            if client in ready:
                data = client.recv(CHUNK_BYTES)
                if not data:
                    return
                chan.sendall(data)
            if chan in ready:
                data = chan.recv(CHUNK_BYTES)
                if not data:
                    return
                client.sendall(data)
        except (OSError, EOFError, ValueError):
            return
