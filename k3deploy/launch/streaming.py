"""Node-prefixed log streaming: one follower thread per node, surviving group restarts."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from k3deploy.errors import ExecError
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.fleet import NodeFleet

LineSink = Callable[[int, str, str], None]  # rank, host, line
REFOLLOW_WAIT_S = 0.5


class LogStreamer:
    """Follows each node's current process log; when a process ends it waits for the next handle
    (a restart) until stopped. `handles()` is read on every (re)follow."""

    def __init__(self, fleet: NodeFleet, handles: Callable[[], Mapping[int, ProcessHandle]], sink: LineSink,
                 tail_lines: int = 10, until_exit: bool = False, ranks: Iterable[int] | None = None) -> None:
        self.fleet, self.handles, self.sink = fleet, handles, sink
        self.tail_lines = tail_lines
        self.until_exit = until_exit  # stop following a node once its process ended (`logs --follow`)
        self.stop_event = threading.Event()
        self._threads = [threading.Thread(target=self._follow, args=(rank,), daemon=True,
                                          name=f"k3log-{rank}") for rank in (ranks or fleet.ranks)]

    def start(self) -> LogStreamer:
        """Start every follower."""
        for t in self._threads:
            t.start()
        return self

    def _follow(self, rank: int) -> None:
        seen: ProcessHandle | None = None
        for _ in range(10**6):  # one pass per process this node runs; ends on stop
            if self.stop_event.is_set():
                return
            handle = self.handles().get(rank)
            if handle is None or handle == seen:
                if self.until_exit and seen is not None:
                    return
                self.stop_event.wait(REFOLLOW_WAIT_S)
                continue
            tail = self.tail_lines if seen is None else 10**6  # a restarted process: its whole log
            seen = handle
            try:
                for line in self.fleet.executor(rank).follow(handle, tail, self.stop_event):
                    self.sink(rank, self.fleet.host(rank), line)
            except ExecError as exc:
                self.sink(rank, self.fleet.host(rank), f"[k3deploy] log stream ended: {exc}")

    def alive(self) -> bool:
        """Some follower still runs."""
        return any(t.is_alive() for t in self._threads)

    def wait(self, timeout_s: float) -> bool:
        """Wait until every follower ended (True) or the timeout passed."""
        for t in self._threads:
            t.join(timeout_s)
        return not self.alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask every follower to end and wait a little for them."""
        self.stop_event.set()
        self.wait(timeout_s)
