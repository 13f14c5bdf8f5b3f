"""Every started node on one long-lived stream (its log, through the executor's `follow`): a node's first
line, a fatal line and its process's end are seen when they happen, not on the next poll of every node."""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from k3deploy.errors import ExecError
from k3deploy.executors.base import EXIT_MARK, ProcessHandle
from k3deploy.executors.fleet import NodeFleet

SeenKind = Literal["line", "ended", "error", "poll"]
ALL = -1  # the rank of a "poll": time to ask every node (a watch without streams)
# Lines of a log already written when a node is first followed (the start-up lines a poll would have read).
FIRST_TAIL_LINES = 40
JOIN_S = 5.0
# A stream that ended while its process still ran is opened again this much later.
REFOLLOW_DELAY_S = 0.5


@dataclass(frozen=True)
class Seen:
    """What one node's stream showed: a log line, its end (the process ended, or the stream did), or an
    error reaching the node; or, without streams, that it is time to ask every node."""

    rank: int
    kind: SeenKind
    text: str = ""

    @property
    def ends_process(self) -> bool:
        """Evidence that the node's process ended (or that only a check can tell)."""
        return self.kind != "line" or EXIT_MARK in self.text


class NodeWatch:
    """One follower thread per node, all feeding one queue; `refollow` starts a node's stream again (after a
    stream ended while its process still runs, or after a restart with new handles). With `poll_s` (nodes
    reached without channels: Ray, where a long-poll per node and call costs more than a poll) there are no
    streams: `wait` says "poll" every `poll_s`, and the caller asks every node as it always did."""

    def __init__(self, fleet: NodeFleet, handles: Callable[[], Mapping[int, ProcessHandle]],
                 poll_s: float | None = None) -> None:
        self.fleet, self.handles, self.poll_s = fleet, handles, poll_s
        self._next_poll = time.monotonic() + (poll_s or 0.0)
        self.queue: queue.Queue[Seen | None] = queue.Queue()
        self._stops: dict[int, threading.Event] = {}
        self._threads: list[threading.Thread] = []

    def start(self, ranks: Iterable[int] | None = None, tail_lines: int = FIRST_TAIL_LINES) -> NodeWatch:
        """Follow the given ranks (default: every rank with a handle)."""
        for rank in list(self.handles()) if ranks is None else ranks:
            self.refollow(rank, tail_lines)
        return self

    def refollow(self, rank: int, tail_lines: int = 0, delay_s: float = 0.0) -> None:
        """(Re)start following one node, after `delay_s` (a stream that ended under a live process may end
        again at once: its Ray agent is gone, say, and the process soon with it); a stream it had is ended."""
        old = self._stops.pop(rank, None)
        if old is not None:
            old.set()
        if self.poll_s is not None:
            return
        handle = self.handles().get(rank)
        if handle is None:
            return
        stop = self._stops[rank] = threading.Event()
        t = threading.Thread(target=self._follow, args=(rank, handle, tail_lines, stop, delay_s), daemon=True,
                             name=f"k3watch-{rank}")
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _follow(self, rank: int, handle: ProcessHandle, tail_lines: int, stop: threading.Event,
                delay_s: float) -> None:
        if stop.wait(delay_s):
            return
        ex = self.fleet.executor(rank)
        try:
            ex.connect()
            if stop.is_set():  # closed while connecting (a stop soon after start-up): no stream to open
                return
            for line in ex.follow(handle, tail_lines, stop):
                self.queue.put(Seen(rank, "line", line))
        except ExecError as exc:
            if not stop.is_set():
                self.queue.put(Seen(rank, "error", str(exc)))
            return
        if not stop.is_set():
            self.queue.put(Seen(rank, "ended"))

    def wait(self, timeout_s: float) -> list[Seen]:
        """Everything seen within `timeout_s` (returns at the first news, with whatever else is queued)."""
        if self.poll_s is not None:
            time.sleep(max(0.0, min(timeout_s, self._next_poll - time.monotonic())))
            if time.monotonic() < self._next_poll:
                return []
            self._next_poll = time.monotonic() + self.poll_s
            return [Seen(ALL, "poll")]
        try:
            first = self.queue.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return []
        got = [first]
        for _ in range(100_000):  # bounded: what is queued right now
            try:
                got.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return [s for s in got if s is not None]

    def close(self, wait_s: float = JOIN_S) -> None:
        """End every stream and wait up to `wait_s` for the followers (0: let them end on their own, as they
        do within a read timeout, or when their connection closes)."""
        for stop in self._stops.values():
            stop.set()
        self._stops.clear()
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]  # a later close waits for these again
