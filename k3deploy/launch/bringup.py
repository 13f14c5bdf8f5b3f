"""Bringing a gang up and tearing it down, each step told to the deployment's recorder: connect, the pre-start
hook (launch's preflight), start head first, readiness; on failure stop every started node, record why with
their logs.
Launch, the supervisor's restarts, stop and status all use it."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from k3deploy.errors import K3Error
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.launch.allocation import StartFn, allocation_of
from k3deploy.launch.events import EventSink, ignore
from k3deploy.launch.gang import Gang, GroupFailed, new_run_id
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Deployment, Failure
from k3deploy.records.recorder import Recorder
from k3deploy.records.status import Status

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


def bring_up(gang: Gang, recorder: Recorder, dep: Deployment, interrupt: threading.Event | None = None,
             *, last_try: bool = True, before_start: Callable[[Gang], None] | None = None,
             start: StartFn | None = None) -> Deployment:
    """Connect, run `before_start` (launch's preflight), start (head first; `start`: the allocation's own),
    wait for readiness (as long as the record `dep` says); on any failure or interrupt stop every node that
    was started, record the cause and re-raise. After the last try the owner lets go in the same write."""
    try:
        gang.connect()
        if before_start is not None:
            before_start(gang)
        if start is None:
            gang.start(new_run_id(), on_started=recorder.started)
        else:
            start(gang, recorder.started)
        gang.wait_ready(dep.ready_timeout_s, interrupt=interrupt)
    except BaseException as exc:
        failure = _failure_of(exc, gang)
        interrupted = isinstance(exc, KeyboardInterrupt)
        status: Status = "stopped" if interrupted else "failed" if last_try else "restarting"
        outcome = teardown(gang, recorder, dep, failure, status=status, release_owner=last_try or interrupted)
        left = [f"rank {rank} ({gang.fleet.host(rank)})" for rank, what in sorted(outcome.items())
                if what != "stopped"]
        if left:
            hint = f"{', '.join(left)} may still run; once reachable again: k3deploy stop {gang.name}"
            if isinstance(exc, GroupFailed):
                raise GroupFailed(exc.failure, left, hint) from None
            if isinstance(exc, K3Error):
                exc.hint = hint
        raise
    return recorder.ready()


def _failure_of(exc: BaseException, gang: Gang) -> Failure:
    if isinstance(exc, GroupFailed):
        return exc.failure
    if isinstance(exc, KeyboardInterrupt):
        return Failure(rank=None, host=None, cause="interrupted; every started node was stopped")
    host = getattr(exc, "host", None)
    rank = next((j.rank for j in gang.jobs if j.host == host), None)
    return Failure(rank=rank, host=host, cause=str(exc).removeprefix(f"{host}: "))


def teardown(gang: Gang, recorder: Recorder, dep: Deployment, failure: Failure | None, status: Status,
             release_owner: bool = False) -> dict[int, str]:
    """Stop every node of the gang (as gracefully as the record `dep` says, then its allocation), then record
    the outcome with local copies of their logs (and, when nobody will act on the deployment any more, clear its
    owner in the same write)."""
    gang.final_logs.clear()
    outcome = gang.stop(dep.stop_grace_s, log_lines=LOCAL_LOG_LINES)
    # After every node is stopped and read (a job's steps run only while the job does).
    failure, gone = allocation_of(dep).release(failure)
    outcome = {rank: "stopped" for rank in outcome} if gone else outcome  # the allocation ended what was left
    recorder.stopped(failure, status, outcome, gang.final_logs, release_owner=release_owner)
    return outcome
