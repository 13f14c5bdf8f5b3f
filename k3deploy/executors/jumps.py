"""Jump-host connections shared by every node behind the same chain: one handshake per bastion, not one
per node (bastions rate-limit and drop bursts of unauthenticated connections: sshd's MaxStartups)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    client: Any = None
    users: int = 0


class JumpPool:
    """Reference-counted connections by key; a dead one is replaced by the next `acquire`."""

    def __init__(self, alive: Callable[[Any], bool]) -> None:
        self._alive = alive
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}

    def acquire(self, key: Hashable, connect: Callable[[], Any]) -> Any:
        """The live connection for `key`, made with `connect` by the first caller (the others wait for it)."""
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            entry.users += 1
        try:
            with entry.lock:
                if entry.client is not None and not self._alive(entry.client):
                    entry.client.close()
                    entry.client = None
                if entry.client is None:
                    entry.client = connect()
                return entry.client
        except BaseException:
            self.release(key)
            raise

    def release(self, key: Hashable) -> None:
        """One user fewer; the last one closes the connection."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.users -= 1
            if entry.users > 0:
                return
            del self._entries[key]
        with entry.lock:
            if entry.client is not None:
                entry.client.close()
                entry.client = None

    def users(self, key: Hashable) -> int:
        """How many holders the connection for `key` has (0: none open)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.users if entry is not None else 0
