"""Bringing a gang up and tearing it down, each step recorded: connect, the pre-start hook (launch's
preflight), start head first, readiness; on failure stop every started node, keep their logs, record why.
Launch, the supervisor's restarts, stop and status all use it."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence

from k3deploy.errors import K3Error
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.launch.allocation import StartFn, allocation_of
from k3deploy.launch.events import EventSink, ignore
from k3deploy.launch.gang import Gang, GroupFailed, new_run_id
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Deployment, Failure
from k3deploy.records.status import Status
from k3deploy.records.store import StateStore

LOCAL_LOG_LINES = 5000


def fleet_of(jobs: Sequence[NodeJob], factory: ExecutorFactory = open_executor) -> NodeFleet:
    """The fleet reaching the given jobs' nodes."""
    return NodeFleet({j.rank: j.target for j in jobs}, factory)


def open_gang(dep: Deployment, factory: ExecutorFactory = open_executor, on_event: EventSink = ignore,
              ranks: Sequence[int] | None = None) -> Gang:
    """A Gang over the record's jobs (or only the given ranks), with the handles it holds; close it."""
    jobs = [j for j in dep.jobs if ranks is None or j.rank in ranks]
    gang = Gang(dep.name, jobs, fleet_of(jobs, factory), on_event, probe_from=dep.probe_from)
    gang.handles.update({n.rank: n.handle for n in dep.nodes if n.handle is not None and n.rank in gang.fleet.targets})
    return gang


def record_started(store: StateStore, name: str) -> Callable[[NodeJob, ProcessHandle], None]:
    """Write each handle into the record before its start returns (a crash never orphans it). Handles that
    arrive while a write is under way go into the next write together: one write per wave of starts, not one
    locked, fsynced write per node after another."""
    pending: dict[int, ProcessHandle] = {}
    mutex = threading.Lock()  # held across a write: a caller returns only once its handle is on disk
    taken = threading.Lock()

    def apply(d: Deployment, batch: dict[int, ProcessHandle]) -> Deployment:
        for rank, handle in batch.items():
            d = d.with_node(rank, handle=handle, phase="started")
        return d

    def write(job: NodeJob, handle: ProcessHandle) -> None:
        with taken:
            pending[job.rank] = handle
        with mutex:
            with taken:
                batch = dict(pending)
                pending.clear()
            if batch:
                store.update(name, lambda d: apply(d, batch))

    return write


def bring_up(gang: Gang, store: StateStore, ready_timeout_s: float, interrupt: threading.Event | None = None,
             *, last_try: bool = True, before_start: Callable[[Gang], None] | None = None,
             start: StartFn | None = None) -> Deployment:
    """Connect, run `before_start` (launch's preflight), start (head first; `start`: the allocation's own),
    wait for readiness; on any failure or interrupt stop every node that was started, record the cause and
    re-raise. After the last try the owner lets go in the same write."""
    name = gang.name
    try:
        gang.connect()
        if before_start is not None:
            before_start(gang)
        if start is None:
            gang.start(new_run_id(), on_started=record_started(store, name))
        else:
            start(gang, record_started(store, name))
        gang.wait_ready(ready_timeout_s, interrupt=interrupt)
    except BaseException as exc:
        failure = _failure_of(exc, gang)
        interrupted = isinstance(exc, KeyboardInterrupt)
        status: Status = "stopped" if interrupted else "failed" if last_try else "restarting"
        outcome = teardown(gang, store, failure, status=status, release_owner=last_try or interrupted)
        left = [f"rank {rank} ({gang.fleet.host(rank)})" for rank, what in sorted(outcome.items())
                if what != "stopped"]
        if left:
            hint = f"{', '.join(left)} may still run; once reachable again: k3deploy stop {name}"
            if isinstance(exc, GroupFailed):
                raise GroupFailed(exc.failure, left, hint) from None
            if isinstance(exc, K3Error):
                exc.hint = hint
        raise
    now = time.time()

    def ready(d: Deployment) -> Deployment:
        nodes = tuple(n.model_copy(update={"phase": "ready"}) for n in d.nodes)
        last = d.attempts[-1].model_copy(update={"ready_at": now})
        return d.model_copy(update={"status": "ready", "ready_at": now, "nodes": nodes,
                                    "attempts": (*d.attempts[:-1], last)})

    return store.update(name, ready)


def _failure_of(exc: BaseException, gang: Gang) -> Failure:
    if isinstance(exc, GroupFailed):
        return exc.failure
    if isinstance(exc, KeyboardInterrupt):
        return Failure(rank=None, host=None, cause="interrupted; every started node was stopped")
    host = getattr(exc, "host", None)
    rank = next((j.rank for j in gang.jobs if j.host == host), None)
    return Failure(rank=rank, host=host, cause=str(exc).removeprefix(f"{host}: "))


def teardown(gang: Gang, store: StateStore, failure: Failure | None, status: Status,
             release_owner: bool = False) -> dict[int, str]:
    """Stop every node of the gang, keep local copies of their logs, record the outcome (and, when
    nobody will act on the deployment any more, clear its owner in the same write)."""
    dep = store.require(gang.name)
    gang.final_logs.clear()
    outcome = gang.stop(dep.stop_grace_s, log_lines=LOCAL_LOG_LINES)
    # After every node is stopped and read (a job's steps run only while the job does).
    failure, gone = allocation_of(dep).release(failure)
    outcome = {rank: "stopped" for rank in outcome} if gone else outcome  # the allocation ended what was left
    try:
        save_local_logs(gang, store)
    except OSError as exc:  # a full or read-only state disk must not hide why the gang was stopped
        print(f"k3deploy: cannot keep local copies of the node logs: {exc}", file=sys.stderr)

    record_stopped(store, gang.name, failure, status, outcome, release_owner)
    return outcome


def record_stopped(store: StateStore, name: str, failure: Failure | None, status: Status,
                   outcome: dict[int, str], release_owner: bool) -> None:
    """One write: the last attempt closed, each node's outcome, the status (and the owner let go)."""
    def record(d: Deployment) -> Deployment:
        d = d.end_attempt(failure.cause if failure else "stopped")
        for rank, what in outcome.items():
            d = d.with_node(rank, phase="stopped" if what == "stopped" else "unknown")
        update: dict[str, object] = {"status": status}
        if release_owner:
            update["owner"] = None
        if failure is not None:
            update["failure"] = failure
        return d.model_copy(update=update)

    store.update(name, record)


def save_local_logs(gang: Gang, store: StateStore) -> None:
    """Keep each node's log end (read by the stop) in the state directory, for `logs` once the nodes are gone."""
    dest = store.logs_dir(gang.name)
    for folder in (dest.parent, dest):  # mkdir(parents=True) would make the parent 0755
        folder.mkdir(mode=0o700, exist_ok=True)
    for rank, text in gang.final_logs.items():
        if text:  # a node whose log is gone keeps its earlier copy; logs are private like the record
            fd = os.open(dest / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)

