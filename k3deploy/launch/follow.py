"""Node-prefixed logs in the foreground: `logs --follow` over a recorded deployment, and `launch --attach`
supervising while it streams; one sink format for both."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TextIO

from k3deploy.errors import StateError
from k3deploy.executors.base import ProcessHandle
from k3deploy.launch.bringup import fleet_of
from k3deploy.launch.deploy import stop
from k3deploy.launch.events import GROUP, EventSink, NodeEvent, ignore
from k3deploy.launch.gang import GroupFailed
from k3deploy.launch.streaming import LineSink, LogStreamer
from k3deploy.launch.supervisor import Supervisor
from k3deploy.records.deployment import Deployment
from k3deploy.records.status import ACTIVE
from k3deploy.records.store import StateStore

# How often `follow` reads the record to see whether the deployment is still active.
RECHECK_S = 1.0


def prefixed(out: TextIO) -> LineSink:
    """A sink writing each line as `[rank host] line` to `out`, flushed (a pipe sees it at once)."""
    def sink(rank: int, host: str, line: str) -> None:
        out.write(f"[{rank} {host}] {line}\n")
        out.flush()

    return sink


def follow(store: StateStore, name: str, sink: LineSink, ranks: Sequence[int] | None = None,
           tail_lines: int = 10) -> None:
    """Stream an active deployment's node logs (the handles as the record holds them, restarts included)
    until Ctrl-C, or every stream ended and the deployment is no longer active."""
    dep = store.require(name)
    if dep.status not in ACTIVE:
        raise StateError(f"{name} is {dep.status}: nothing to follow", hint=f"k3deploy logs {name}")
    fleet = fleet_of([j for j in dep.jobs if ranks is None or j.rank in ranks])

    def handles() -> Mapping[int, ProcessHandle]:
        current = store.load(name)
        return {n.rank: n.handle for n in current.nodes if n.handle is not None} if current else {}

    streamer = LogStreamer(fleet, handles, sink, tail_lines=tail_lines).start()
    try:
        for _ in range(10**9):  # until Ctrl-C, or every stream ended and the deployment is no longer active
            if streamer.wait(RECHECK_S):
                break
            current = store.load(name)
            if current is None or current.status not in ACTIVE:
                break
    finally:
        streamer.stop()
        fleet.close()


def attach(store: StateStore, name: str, sink: LineSink, on_event: EventSink = ignore) -> Deployment:
    """Supervise in the foreground while streaming node logs to `sink`; Ctrl-C stops the deployment (and is
    raised again); GroupFailed when the supervisor gave up on it."""
    sup = Supervisor(store, name, on_event=on_event)
    fleet = fleet_of(store.require(name).jobs)

    def handles() -> Mapping[int, ProcessHandle]:
        return dict(sup.gang.handles) if sup.gang is not None else {}

    streamer = LogStreamer(fleet, handles, sink).start()
    try:
        final = sup.run()
    except KeyboardInterrupt:
        on_event(NodeEvent(GROUP, "", "stopping", "every node"))
        streamer.stop()
        stop(store, name)
        raise
    finally:
        streamer.stop()
        fleet.close()
    if final.status == "failed" and final.failure is not None:
        raise GroupFailed(final.failure)
    return final
