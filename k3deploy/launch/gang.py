"""Gang semantics for one group of node processes: start head first, watch all, stop all together."""
from __future__ import annotations

import posixpath
import shlex
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.base import Executor, ProcessHandle, exit_record
from k3deploy.executors.fleet import NodeFleet, require_all
from k3deploy.executors.http import NodeHttp, serving
from k3deploy.launch.events import EventSink, NodeEvent, ignore
from k3deploy.launch.jobs import NodeJob
from k3deploy.launch.readiness import ProbeFrom, fatal_line
from k3deploy.launch.state import Failure

POLL_S = 0.5
LOG_TAIL_LINES = 40
STOP_POLL_S = 0.2


class GroupFailed(LaunchError):
    """The group was torn down; `failure` names the node that failed first (when there is one)."""

    def __init__(self, failure: Failure) -> None:
        self.failure = failure
        who = f"rank {failure.rank} ({failure.host})" if failure.rank is not None else "the deployment"
        text = f"{who}: {failure.cause}; every node was stopped"
        if failure.log_tail.strip():
            text += f"\n--- last lines of {failure.host}'s log ---\n{failure.log_tail.rstrip()}"
        super().__init__(text)


@dataclass(frozen=True)
class Probe:
    """One node seen in one polling round; alive None means the host could not be asked."""

    job: NodeJob
    alive: bool | None
    log: str = ""
    error: str = ""


def new_run_id() -> str:
    """A short id telling one start of the group from any earlier one."""
    return uuid.uuid4().hex[:10]


class Gang:
    """One deployment's node processes and the fleet that reaches them (the gang closes the fleet)."""

    def __init__(self, name: str, jobs: Sequence[NodeJob], fleet: NodeFleet, on_event: EventSink = ignore,
                 probe_from: ProbeFrom = "here") -> None:
        self.name = name
        self.probe_from = probe_from
        self.jobs = tuple(sorted(jobs, key=lambda j: j.rank))
        self.fleet = fleet
        self.emit = on_event
        self.handles: dict[int, ProcessHandle] = {}
        self._head_http: NodeHttp | None = None

    def executor(self, rank: int) -> Executor:
        """The executor of one node."""
        return self.fleet.executor(rank)

    def close(self) -> None:
        """Close the readiness client and every connection."""
        if self._head_http is not None:
            self._head_http.close()
            self._head_http = None
        self.fleet.close()

    def _event(self, job: NodeJob, phase: str, detail: str = "") -> None:
        self.emit(NodeEvent(job.rank, job.host, phase, detail))

    def connect(self) -> None:
        """Connect to every node at once; the first failure (rank order) is raised naming all of them."""
        for job in self.jobs:
            self._event(job, "connecting")
        outcomes = self.fleet.connect_all()
        for job in self.jobs:
            o = outcomes[job.rank]
            self._event(job, "connected") if o.ok else self._event(job, "unreachable", str(o.error))
        require_all(outcomes)

    def start(self, run_id: str, on_started: Callable[[NodeJob, ProcessHandle], None] | None = None) -> None:
        """Rank 0 first, then every worker at once; a failed start raises ExecError (caller stops the rest)."""
        jobs = {j.rank: j for j in self.jobs}

        def one(rank: int, ex: Executor) -> ProcessHandle:
            job = jobs[rank]
            self._event(job, "starting")
            handle = ex.start(job.command, job.log_path, workdir=posixpath.dirname(job.log_path) or "/",
                              tag=job.tag(self.name, run_id))
            self.handles[rank] = handle
            if on_started is not None:
                on_started(job, handle)
            self._event(job, "started", f"pid {handle.pid}")
            return handle

        head, workers = self.jobs[0], [j.rank for j in self.jobs[1:]]
        one(head.rank, self.executor(head.rank))
        failed = [o for _, o in sorted(self.fleet.map(one, workers).items()) if not o.ok]
        if failed:
            err = failed[0].error
            raise err if isinstance(err, ExecError) else ExecError(f"start failed: {err}", host=failed[0].host)

    def probe(self, with_logs: bool) -> list[Probe]:
        """One polling round over every started node; logs are read for dead nodes or when asked."""
        jobs = {j.rank: j for j in self.jobs}

        def one(rank: int, ex: Executor) -> Probe:
            job, handle = jobs[rank], self.handles[rank]
            try:
                alive = ex.alive(handle)
                log = ex.read_log(handle, LOG_TAIL_LINES) if with_logs or not alive else ""
            except ExecError as exc:
                return Probe(job, None, error=str(exc))
            return Probe(job, alive, log)

        outs = self.fleet.map(one, [j.rank for j in self.jobs if j.rank in self.handles])
        for o in outs.values():
            if o.error is not None:
                raise o.error  # a bug, not a host problem: ExecError became a Probe above
        return [o.value for _, o in sorted(outs.items()) if o.value is not None]

    def first_failure(self, probes: Sequence[Probe], unreachable_counts: bool = True) -> Failure | None:
        """The node that failed first: earliest exit (a node killed outright, with no exit record, first),
        then a fatal log line, then an unreachable host."""
        dead = [p for p in probes if p.alive is False]
        if dead:
            def order(p: Probe) -> tuple[int, float]:
                rec = exit_record(p.log)
                return (0, 0.0) if rec is None else (1, rec[1])

            p = min(dead, key=order)
            rec = exit_record(p.log)
            cause = (f"exited with status {rec[0]}" + _signal_note(rec[0]) if rec is not None
                     else "its process is gone (killed; no exit status was recorded)")
            return Failure(rank=p.job.rank, host=p.job.host, cause=cause, log_tail=p.log)
        for p in probes:
            line = fatal_line(p.log) if p.alive else None
            if line:
                return Failure(rank=p.job.rank, host=p.job.host, cause=f"fatal error in its log: {line}",
                               log_tail=p.log)
        lost = [p for p in probes if p.alive is None]
        if lost and unreachable_counts:
            return Failure(rank=lost[0].job.rank, host=lost[0].job.host, cause=f"unreachable: {lost[0].error}")
        return None

    def wait_ready(self, timeout_s: float, interrupt: threading.Event | None = None) -> None:
        """Until rank 0 serves every readiness path, watching all nodes; GroupFailed on any failure or the
        deadline (the caller stops the group)."""
        head = self.jobs[0]
        deadline = time.monotonic() + timeout_s
        loading: set[int] = set()
        why = "not polled yet"
        for _ in range(int(timeout_s / POLL_S) + 100):
            if interrupt is not None and interrupt.is_set():
                raise KeyboardInterrupt
            probes = self.probe(with_logs=True)
            failure = self.first_failure(probes)
            if failure is not None:
                self._event(next(j for j in self.jobs if j.rank == failure.rank), "failed", failure.cause)
                raise GroupFailed(failure)
            for p in probes:
                if p.log.strip() and p.job.rank not in loading:
                    loading.add(p.job.rank)
                    self._event(p.job, "loading")
            ok, why = self.head_serving()
            if ok:
                for job in self.jobs:
                    self._event(job, "ready")
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _sleep(min(POLL_S, left), interrupt)
        raise GroupFailed(Failure(rank=head.rank, host=head.host,
                                  cause=f"not ready after {timeout_s:g} s (launch.ready_timeout_s): {why}",
                                  log_tail=self._tail(head)))

    def _tail(self, job: NodeJob) -> str:
        handle = self.handles.get(job.rank)
        if handle is None:
            return ""
        try:
            return self.executor(job.rank).read_log(handle, LOG_TAIL_LINES)
        except ExecError:
            return ""

    def stop(self, grace_s: float) -> dict[int, str]:
        """SIGTERM every started group, wait up to grace_s, SIGKILL what is left; rank -> outcome."""
        jobs = {j.rank: j for j in self.jobs if j.rank in self.handles}
        outcome: dict[int, str] = {}

        def send(sig: int) -> Callable[[int, Executor], bool]:
            return lambda rank, ex: ex.signal(self.handles[rank], sig)

        def still_there(outs: Mapping[int, Any]) -> list[int]:
            return [rank for rank, o in sorted(outs.items()) if o.value or o.error is not None]

        for job in jobs.values():
            self._event(job, "stopping")
        for rank, o in self.fleet.map(send(signal.SIGTERM), jobs).items():
            if o.error is not None:
                outcome[rank] = f"unreachable: {o.error}"
        pending = [r for r in jobs if r not in outcome]
        deadline = time.monotonic() + grace_s
        for _ in range(int(grace_s / STOP_POLL_S) + 2):
            pending = still_there(self.fleet.map(lambda rank, ex: ex.alive(self.handles[rank]), pending))
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(STOP_POLL_S)
        reachable = [r for r in jobs if r not in outcome]
        for _ in range(3):  # SIGKILL whatever of each group is left, until nothing carries the tag
            self.fleet.map(send(signal.SIGKILL), reachable)
            self.fleet.map(self._remove_container, [r for r in reachable if jobs[r].container])
            left = still_there(self.fleet.map(send(0), reachable))
            if not left:
                break
            reachable = left
            time.sleep(STOP_POLL_S)
        else:
            for rank in reachable:
                outcome[rank] = "processes survived SIGKILL"
        for rank, job in jobs.items():
            what = outcome.setdefault(rank, "stopped")
            self._event(job, "stopped") if what == "stopped" else self._event(job, "failed", what)
        return outcome

    def _remove_container(self, rank: int, ex: Executor) -> None:
        container = next(j.container for j in self.jobs if j.rank == rank)
        assert container is not None
        ex.run(shlex.join(["docker", "rm", "-f", container]), timeout_s=60)

    def logs(self, lines: int) -> dict[int, str]:
        """The last `lines` lines of every started node's log (unreachable nodes left out)."""
        outs = self.fleet.map(lambda rank, ex: ex.read_log(self.handles[rank], lines), list(self.handles))
        return {rank: o.value for rank, o in outs.items() if o.value is not None}

    def head_serving(self) -> tuple[bool, str]:
        """Rank 0 answers every readiness path, asked from here or as rank 0 itself sees it (`probe_from`:
        through a port its executor forwards, or on the node)."""
        head = self.jobs[0]
        if head.ready.kind == "none" or not head.ready.url:
            return True, ""
        if self._head_http is None:
            via = self.executor(head.rank) if self.probe_from == "head" else None
            self._head_http = NodeHttp(head.ready.url, via=via)
        try:
            return serving(self._head_http, head.ready.paths)
        except ExecError as exc:  # a forward that could not be opened: not serving as far as we can tell
            return False, str(exc)


def _signal_note(status: int) -> str:
    if status > 128:
        try:
            return f" (killed by {signal.Signals(status - 128).name})"
        except ValueError:
            return ""
    return ""


def _sleep(seconds: float, interrupt: threading.Event | None) -> None:
    if interrupt is not None:
        if interrupt.wait(seconds):
            raise KeyboardInterrupt
    else:
        time.sleep(seconds)
