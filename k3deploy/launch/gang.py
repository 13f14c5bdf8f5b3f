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

from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.base import Executor, ProcessHandle
from k3deploy.executors.fanout import FanOut
from k3deploy.executors.posix import exit_record
from k3deploy.launch.events import EventSink, NodeEvent, ignore
from k3deploy.launch.jobs import NodeJob
from k3deploy.launch.nodecheck import check_script, verdict
from k3deploy.launch.readiness import ProbeFrom, fatal_line, serving, serving_through
from k3deploy.launch.state import Failure

POLL_S = 0.5
LOG_TAIL_LINES = 40
STOP_POLL_S = 0.2
CHECK_TIMEOUT_S = 20.0


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
    """One deployment's node processes and the executors that reach them."""

    def __init__(self, name: str, jobs: Sequence[NodeJob], executors: Mapping[int, Executor], pool: FanOut,
                 on_event: EventSink = ignore, probe_from: ProbeFrom = "here") -> None:
        self.name = name
        self.probe_from = probe_from
        self.jobs = tuple(sorted(jobs, key=lambda j: j.rank))
        self.executors = executors
        self.pool = pool
        self.emit = on_event
        self.handles: dict[int, ProcessHandle] = {}

    def _event(self, job: NodeJob, phase: str, detail: str = "") -> None:
        self.emit(NodeEvent(job.rank, job.host, phase, detail))

    def connect(self) -> None:
        """Connect to every node at once; the first failure (rank order) is raised naming all of them."""
        for job in self.jobs:
            self._event(job, "connecting")

        def one(job: NodeJob) -> None:
            self.executors[job.rank].connect()
            self._event(job, "connected")

        failed = [o for o in self.pool.map(one, self.jobs) if not o.ok]
        for o in failed:
            self._event(o.item, "unreachable", str(o.error))
        if failed:
            first, host = failed[0].error, failed[0].item.host
            others = ", ".join(o.item.host for o in failed[1:])
            also = f" (also failed: {others})" if others else ""
            if isinstance(first, ExecError):
                text = str(first).removeprefix(f"{first.host}: ")
                raise ExecError(text + also, host=first.host or host, hint=first.hint)
            raise ExecError(f"connect failed: {first}{also}", host=host)

    def check_nodes(self) -> None:
        """Each node has its `iface` with its `ip` on it (one command round); GroupFailed naming the first
        node (rank order) that does not, before anything is started."""
        def one(job: NodeJob) -> str | None:
            out = self.executors[job.rank].run(check_script(job.iface), timeout_s=CHECK_TIMEOUT_S)
            return verdict(job.iface, job.ip, out.stdout) if out.exit_code == 0 else None

        jobs = [j for j in self.jobs if j.iface]
        for o in self.pool.map(one, jobs):
            if o.error is not None:
                raise o.error
            if o.value:
                self._event(o.item, "failed", o.value)
                raise GroupFailed(Failure(rank=o.item.rank, host=o.item.host, cause=o.value))

    def start(self, run_id: str, on_started: Callable[[NodeJob, ProcessHandle], None] | None = None) -> None:
        """Rank 0 first, then every worker at once; a failed start raises ExecError (caller stops the rest)."""
        def one(job: NodeJob) -> ProcessHandle:
            self._event(job, "starting")
            handle = self.executors[job.rank].start(job.command, job.log_path,
                                                    workdir=posixpath.dirname(job.log_path) or "/",
                                                    tag=job.tag(self.name, run_id))
            self.handles[job.rank] = handle
            if on_started is not None:
                on_started(job, handle)
            self._event(job, "started", f"pid {handle.pid}")
            return handle

        head, workers = self.jobs[0], self.jobs[1:]
        one(head)
        failed = [o for o in self.pool.map(one, workers) if not o.ok]
        if failed:
            err = failed[0].error
            raise err if isinstance(err, ExecError) else ExecError(f"start failed: {err}", host=failed[0].item.host)

    def probe(self, with_logs: bool) -> list[Probe]:
        """One polling round over every started node; logs are read for dead nodes or when asked."""
        def one(job: NodeJob) -> Probe:
            ex, handle = self.executors[job.rank], self.handles[job.rank]
            try:
                alive = ex.alive(handle)
                log = ex.read_log(handle, LOG_TAIL_LINES) if with_logs or not alive else ""
            except ExecError as exc:
                return Probe(job, None, error=str(exc))
            return Probe(job, alive, log)

        started = [j for j in self.jobs if j.rank in self.handles]
        outs = self.pool.map(one, started)
        for o in outs:
            if o.error is not None:
                raise o.error  # a bug, not a host problem: ExecError became a Probe above
        return [o.value for o in outs if o.value is not None]

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
            return self.executors[job.rank].read_log(handle, LOG_TAIL_LINES)
        except ExecError:
            return ""

    def stop(self, grace_s: float) -> dict[int, str]:
        """SIGTERM every started group, wait up to grace_s, SIGKILL what is left; rank -> outcome."""
        jobs = [j for j in self.jobs if j.rank in self.handles]
        outcome: dict[int, str] = {}

        def send(sig: int) -> Callable[[NodeJob], bool]:
            return lambda job: self.executors[job.rank].signal(self.handles[job.rank], sig)

        for job in jobs:
            self._event(job, "stopping")
        for o in self.pool.map(send(signal.SIGTERM), jobs):
            if o.error is not None:
                outcome[o.item.rank] = f"unreachable: {o.error}"
        pending = [j for j in jobs if j.rank not in outcome]
        deadline = time.monotonic() + grace_s
        for _ in range(int(grace_s / STOP_POLL_S) + 2):
            alive = [o.item for o in self.pool.map(lambda j: self.executors[j.rank].alive(self.handles[j.rank]),
                                                    pending) if o.value or o.error is not None]
            pending = alive
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(STOP_POLL_S)
        reachable = [j for j in jobs if j.rank not in outcome]
        for _ in range(3):  # SIGKILL whatever of each group is left, until nothing carries the tag
            self.pool.map(send(signal.SIGKILL), reachable)
            self.pool.map(self._remove_container, [j for j in reachable if j.container])
            left = [o.item for o in self.pool.map(send(0), reachable) if o.value or o.error is not None]
            if not left:
                break
            reachable = left
            time.sleep(STOP_POLL_S)
        else:
            for job in reachable:
                outcome[job.rank] = "processes survived SIGKILL"
        for job in jobs:
            outcome.setdefault(job.rank, "stopped")
            what = outcome[job.rank]
            if what == "stopped":
                self._event(job, "stopped")
            else:
                self._event(job, "failed", what)
        return outcome

    def _remove_container(self, job: NodeJob) -> None:
        assert job.container is not None
        self.executors[job.rank].run(shlex.join(["docker", "rm", "-f", job.container]), timeout_s=60)

    def logs(self, lines: int) -> dict[int, str]:
        """The last `lines` lines of every started node's log (unreachable nodes left out)."""
        started = [j for j in self.jobs if j.rank in self.handles]
        outs = self.pool.map(lambda j: self.executors[j.rank].read_log(self.handles[j.rank], lines), started)
        return {o.item.rank: o.value for o in outs if o.value is not None}


    def head_serving(self) -> tuple[bool, str]:
        """Rank 0 answers every readiness path, asked from here or on rank 0 itself (`probe_from`)."""
        head = self.jobs[0]
        if head.ready.kind == "none" or not head.ready.url:
            return True, ""
        if self.probe_from == "head":
            return serving_through(self.executors[head.rank], head.ready.url, head.ready.paths)
        return serving(head.ready.url, head.ready.paths)


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
