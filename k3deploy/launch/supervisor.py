"""Supervision for the life of a deployment: one node gone, all stopped, cause recorded; restart policy.

Runs detached as `python -m k3deploy.launch.supervisor STATE_FILE` (owner recorded in the state), or in
the foreground under `launch --attach`. SIGTERM/SIGINT end it without touching the nodes, unless the record
says `stopping`: then `stop` sent it, and it stops every node over its live connections before it exits
(`stop` then has nothing left to do but what the supervisor could not reach).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from k3deploy.errors import ExecError, K3Error
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.launch.allocation import Allocation, StaticHosts, allocation_of
from k3deploy.launch.bringup import bring_up, open_gang, teardown
from k3deploy.launch.events import GROUP, EventSink, NodeEvent, ignore
from k3deploy.launch.gang import Gang
from k3deploy.launch.watch import REFOLLOW_DELAY_S, NodeWatch
from k3deploy.records.deployment import Deployment, Failure
from k3deploy.records.owner import Identity
from k3deploy.records.recorder import Recorder
from k3deploy.records.store import StateStore

# A process that ends is seen through its node's stream at once; this round only finds hosts gone silent.
POLL_S = 10.0
# Nodes without channels (Ray) have no streams: every node is asked this often instead.
POLL_NO_STREAMS_S = 1.0
# Consecutive rounds a host may be unreachable before it counts as failed (one SSH hiccup is not a death).
UNREACHABLE_POLLS = 2
OWNER_WAIT_S = 10.0
# How soon a stop request (a signal setting stop_event) is noticed between stream events.
WAKE_S = 0.05


class Supervisor:
    """Watches every node of one deployment until it fails for good or `stop_event` is set."""

    def __init__(self, store: StateStore, name: str, *, factory: ExecutorFactory = open_executor,
                 on_event: EventSink = ignore, stop_event: threading.Event | None = None,
                 poll_s: float = POLL_S) -> None:
        self.recorder = Recorder(store, name)
        self.factory, self.emit = factory, on_event
        self.stop_event = stop_event or threading.Event()
        self.poll_s = poll_s
        self.gang: Gang | None = None
        self.allocation: Allocation = StaticHosts()

    def run(self) -> Deployment:
        """Supervise; returns the final record (status ready when asked to stop, failed when gave up)."""
        dep = self.recorder.record()
        self.allocation = allocation_of(dep)
        self.gang = open_gang(dep, self.factory, self.emit)
        try:
            self._watch(self.gang)
            now = self.recorder.record() if self.stop_event.is_set() else None
            if now is not None and now.status == "stopping":
                # `stop` asked: stop the nodes over these live connections instead of it reconnecting.
                teardown(self.gang, self.recorder, now, None, status="stopped", release_owner=True)
        finally:
            self.gang.close()
        return self.recorder.record()

    def _watch(self, gang: Gang) -> None:
        """Each node's log on one long-lived stream: a process that ends is seen at once (its stream ends, or
        its exit line arrives) and checked; every `poll_s` one `alive` round catches hosts gone silent."""
        watch = gang.watch(POLL_NO_STREAMS_S, tail_lines=0)
        try:
            self._follow(gang, watch)
        finally:
            watch.close(wait_s=0)  # the followers end with their streams; a stop need not wait for them

    def _follow(self, gang: Gang, watch: NodeWatch) -> None:
        misses: dict[int, int] = {}
        outage = 0  # consecutive rounds in which no node answered
        unfollowed: set[int] = set()  # nodes whose stream ended while they could not be asked
        next_round = time.monotonic() + self.poll_s
        for _ in range(10**9):  # ends on stop_event or when the restart budget is spent
            if self.stop_event.is_set():
                self.emit(NodeEvent(GROUP, "", "asked to stop"))
                return
            ended = {s.rank for s in watch.wait(min(WAKE_S, max(0.0, next_round - time.monotonic())))
                     if s.ends_process}
            if not ended and time.monotonic() < next_round:
                continue
            next_round = time.monotonic() + self.poll_s
            probes = gang.probe(with_logs=False)
            for p in probes:
                misses[p.job.rank] = misses.get(p.job.rank, 0) + 1 if p.alive is None else 0
                if p.job.rank in ended or p.job.rank in unfollowed:  # a stream ended under a live process
                    if p.alive:
                        unfollowed.discard(p.job.rank)
                        watch.refollow(p.job.rank, delay_s=REFOLLOW_DELAY_S)
                    elif p.alive is None:
                        unfollowed.add(p.job.rank)
            failure = gang.first_failure(probes, unreachable_counts=False)
            if failure is None and probes and all(p.alive is None for p in probes):
                # No node answers at all: this machine's (or the jump host's) network, not a dead node. Tearing
                # down would fail to reach them anyway and leave the engines unsupervised under a "failed" record.
                # Such a round says nothing about any one node, so it counts toward no node's misses.
                outage += 1
                misses.clear()
                if outage == UNREACHABLE_POLLS:
                    self.emit(NodeEvent(GROUP, "", "unreachable", "no node answers: keeps watching, "
                                        f"not counted as a node failure ({probes[0].error})"))
                continue
            if outage >= UNREACHABLE_POLLS:
                self.emit(NodeEvent(GROUP, "", "reachable", "nodes answer again"))
            outage = 0
            lost = [p for p in probes if p.alive is None and misses[p.job.rank] >= UNREACHABLE_POLLS]
            if failure is None and lost:
                failure = gang.first_failure(lost)
            if failure is None:  # a node the allocation lost (drained, down) keeps its engine running
                failure = self.allocation.node_failure(gang.jobs)
            if failure is None:
                continue
            failure = self.allocation.explain(gang.explain(failure), gang.jobs)
            self.emit(NodeEvent(GROUP, "", "failed", f"rank {failure.rank} ({failure.host}): {failure.cause}"))
            dep = self.recorder.record()
            budget_left = len(dep.attempts) - 1 < dep.restart_max
            teardown(gang, self.recorder, dep, failure, status="restarting" if budget_left else "failed",
                     release_owner=not budget_left)
            if not budget_left or not self._restart(gang):
                return
            misses.clear()
            unfollowed.clear()
            watch.start(tail_lines=0)  # the new processes

    def _restart(self, gang: Gang) -> bool:
        """Relaunch the whole group with doubling backoff until ready or the budget is spent."""
        for _ in range(10**6):
            dep = self.recorder.record()
            used = len(dep.attempts) - 1
            if used >= dep.restart_max:
                return False  # the failed try already recorded status failed and released ownership
            backoff_s = dep.restart_backoff_s * (2**used)
            self.emit(NodeEvent(GROUP, "", "restarting",
                                f"restart {used + 1} of {dep.restart_max} in {backoff_s:g} s"))
            if self.stop_event.wait(backoff_s):
                return False
            attempt = self.recorder.restarting()
            gang.handles.clear()
            try:
                bring_up(gang, self.recorder, attempt, interrupt=self.stop_event,
                         last_try=used + 1 >= dep.restart_max)
                return True
            except KeyboardInterrupt:
                return False
            except K3Error:
                continue  # recorded by bring_up; the next round decides whether to try again
        return False


def _wait_for_ownership(store: StateStore, name: str, me: Identity) -> bool:
    """The launcher records us as owner right after spawning us; anyone else owning it means we leave."""
    deadline = time.monotonic() + OWNER_WAIT_S
    for _ in range(1000):
        owner = store.require(name).owner
        if owner is not None and owner.pid == me.pid:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of the detached supervisor process."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m k3deploy.launch.supervisor STATE_FILE", file=sys.stderr)
        return 2
    path = Path(args[0])
    store, name = StateStore(path.parent), path.stem
    stop_event = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop_event.set())

    def stamp(at: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"

    def log(event: NodeEvent) -> None:
        who = "group" if event.rank == GROUP else f"rank {event.rank} {event.host}"
        print(f"{stamp(event.at)} {who}: {event.phase} {event.detail}".rstrip(), flush=True)

    me = Identity.me("supervisor")
    if not _wait_for_ownership(store, name, me):
        print(f"{name}: not recorded as owner; exiting", flush=True)
        return 1
    print(f"{stamp(time.time())} supervising {name} (pid {os.getpid()})", flush=True)
    try:
        dep = Supervisor(store, name, on_event=log, stop_event=stop_event).run()
    except (K3Error, ExecError) as exc:
        failure = Failure(rank=None, host=getattr(exc, "host", None), cause=f"supervisor error: {exc}")
        Recorder(store, name).owned_by(None, failure)
        print(f"supervisor error: {exc}", flush=True)
        return 1
    print(f"{stamp(time.time())} supervisor exits; deployment {dep.status}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
