"""Gang semantics for one group of node processes: start head first, watch all, stop all together."""
from __future__ import annotations

import posixpath
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from k3deploy.errors import ExecError
from k3deploy.executors.base import Executor, ProcessHandle, exit_record
from k3deploy.executors.fleet import NodeFleet, require_all
from k3deploy.launch.events import EventSink, NodeEvent, ignore
from k3deploy.launch.failures import ENDED_CAUSE, GroupFailed, Probe, first_failure
from k3deploy.launch.head_ready import HeadReadiness
from k3deploy.launch.ipc import with_ipc_dir
from k3deploy.launch.links import blame_link
from k3deploy.launch.node_stop import stop_node, terminate
from k3deploy.launch.watch import FIRST_TAIL_LINES, REFOLLOW_DELAY_S, NodeWatch
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Failure
from k3deploy.serving.readiness import KNOWN_CAUSE, ProbeFrom, cause_line, fatal_line, known_cause

# Rank 0's readiness is asked this often (one HTTP request; the nodes themselves report through their streams).
READY_POLL_S = 0.1
# Nodes without channels (Ray) are asked this often while they start.
POLL_S = 0.5
READY_POLL_MAX_S = 0.5
# After an exit line: rounds (this far apart) until the exited process is gone too.
END_CHECKS = 20
END_CHECK_WAIT_S = 0.1
LOG_TAIL_LINES = 40
# Where an ended engine's cause is looked for: vLLM's shutdown prints dozens of lines after it (leak reports).
CAUSE_TAIL_LINES = 400


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
        self.final_logs: dict[int, str] = {}  # each node's log end, read by `stop` right after stopping it
        # A stop and a start that returns at the same moment agree under this lock on who stops the node.
        self._handles_lock = threading.Lock()
        self._stopping = threading.Event()  # set by stop(): starts still under way stop what they started
        self._grace_s = 0.0
        self.readiness = HeadReadiness(self.jobs[0], lambda: self.executor(self.jobs[0].rank)
                                       if self.probe_from == "head" else None)
        self._watches: list[NodeWatch] = []

    def executor(self, rank: int) -> Executor:
        """The executor of one node."""
        return self.fleet.executor(rank)

    def watch(self, poll_s: float, tail_lines: int = FIRST_TAIL_LINES) -> NodeWatch:
        """One stream per started node, following its log (closed with the gang at the latest); nodes whose
        executor does not stream logs (Ray) are polled every `poll_s` instead."""
        streams = all(self.executor(j.rank).capabilities.streams_logs for j in self.jobs)
        self._watches.append(NodeWatch(self.fleet, lambda: self.handles, None if streams else poll_s))
        return self._watches[-1].start(tail_lines=tail_lines)

    def close(self) -> None:
        """Close the streams, the readiness client and every connection."""
        for w in self._watches:
            w.close()  # before the connections go: a follower must not read from a closed one (Ray client)
        self._watches.clear()
        self.readiness.close()
        self.fleet.close()

    def _job(self, rank: int | None) -> NodeJob:
        """The job of one rank."""
        return next(j for j in self.jobs if j.rank == rank)

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
        tags = {j.rank: j.tag(self.name, run_id) for j in self.jobs}
        commands = {rank: with_ipc_dir(jobs[rank].command, tag) for rank, tag in tags.items()}
        self._stopping.clear()

        def stop_late(job: NodeJob, ex: Executor, handle: ProcessHandle) -> None:
            """The stop has gone by without this node: it is stopped here (its IPC directory too)."""
            gone = terminate(ex, handle, self._grace_s, job.container)
            self._event(job, "stopped" if gone else "failed", "" if gone else "processes survived SIGKILL")
            raise ExecError("started as the group was being stopped; stopped again", host=job.host)

        def one(rank: int, ex: Executor) -> ProcessHandle:
            job = jobs[rank]
            if self._stopping.is_set():
                raise ExecError("not started: the group is being stopped", host=job.host)
            self._event(job, "starting")
            handle = ex.start(commands[rank], job.log_path, workdir=posixpath.dirname(job.log_path) or "/",
                              tag=tags[rank])
            with self._handles_lock:
                self.handles[rank] = handle
                late = self._stopping.is_set()
            if on_started is not None:
                on_started(job, handle)
            if late:
                stop_late(job, ex, handle)
            self._event(job, "started", f"pid {handle.pid}")
            return handle

        head, workers = self.jobs[0], [j.rank for j in self.jobs[1:]]
        # In a pool thread even alone: a Ctrl-C lands in this thread's wait, never between a start that
        # has happened and its handle being kept (the stop could not find that node).
        failed = [o for o in self.fleet.map(one, [head.rank], in_pool=True).values() if not o.ok]
        if failed:
            err = failed[0].error
            raise err if isinstance(err, ExecError) else ExecError(f"start failed: {err}", host=failed[0].host)
        # The readiness client (or tunnel) is made while the workers start, not when rank 0 may already serve.
        warm = threading.Thread(target=self.readiness.warm, daemon=True, name="k3ready")
        warm.start()
        failed = [o for _, o in sorted(self.fleet.map(one, workers).items()) if not o.ok]
        warm.join()
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
        """Which node failed first, of one polling round (failures.first_failure); an ended engine's cause is
        looked for further back in its log when its tail does not say (vLLM's shutdown prints dozens of lines)."""
        failure = first_failure(probes, unreachable_counts)
        ended = failure is not None and failure.cause.startswith(("exited with status", "its process is gone"))
        if failure is None or not ended or (ENDED_CAUSE in failure.cause and KNOWN_CAUSE in failure.cause):
            return failure
        job = self._job(failure.rank)
        tail = self._tail(job, CAUSE_TAIL_LINES)
        why = cause_line(tail) if ENDED_CAUSE not in failure.cause else None
        cause = failure.cause.split(KNOWN_CAUSE)[0] + (f"{ENDED_CAUSE}{why}" if why else "")
        named = known_cause(tail, job.rank, job.host, job.ip, job.iface)
        return failure.model_copy(update={"cause": cause + named})

    def wait_ready(self, timeout_s: float, interrupt: threading.Event | None = None) -> None:
        """Until rank 0 serves every readiness path (asked every READY_POLL_S), following every node's log on
        one stream each; GroupFailed on any failure or the deadline (the caller stops the group)."""
        head = self.jobs[0].rank
        deadline = time.monotonic() + timeout_s
        loading: set[int] = set()
        why = "not asked yet"
        watch = self.watch(POLL_S)
        try:
            next_ask = time.monotonic()
            for _ in range(10**7):  # ends at ready, a failure, the deadline or an interrupt
                if interrupt is not None and interrupt.is_set():
                    raise KeyboardInterrupt
                asked = time.monotonic()
                if asked >= next_ask:
                    ok, why, fatal = self.readiness.check()
                    if fatal:
                        self._fail(self._failure(head, fatal))
                    if ok:
                        for job in self.jobs:
                            self._event(job, "ready")
                        return
                    # A check that costs more (on the node through Ray: a task) is asked less often.
                    took = time.monotonic() - asked
                    next_ask = time.monotonic() + min(READY_POLL_MAX_S, max(READY_POLL_S, 4 * took))
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for seen in watch.wait(min(next_ask - time.monotonic(), left)):
                    if seen.kind == "poll":
                        self._poll_round(loading)
                        continue
                    if seen.kind == "line" and seen.rank not in loading:
                        loading.add(seen.rank)
                        self._event(self._job(seen.rank), "loading")
                    line = fatal_line(seen.text) if seen.kind == "line" else None
                    if line:
                        self._fail(self._failure(seen.rank, f"fatal error in its log: {line}", line))
                    if seen.ends_process:
                        self._check_after_end(seen.rank, watch)
        finally:
            watch.close(wait_s=0)  # followers end within a read timeout; ready need not wait for them
        raise GroupFailed(self._failure(head, f"not ready after {timeout_s:g} s (launch.ready_timeout_s): {why}",
                                        stalled=True))

    def _failure(self, rank: int, cause: str, line: str = "", stalled: bool = False) -> Failure:
        """Why the wait failed, worked out in one place: the node's log end and the catalog's cause of its fatal
        `line`; past the deadline (`stalled`) the first node whose log stops at a known cause (a hang's last
        words, as a Ray placement group vLLM waits for), else rank 0; then the node whose link is down."""
        job = self._job(rank)
        failure = Failure(rank=rank, host=job.host, cause=cause, log_tail=self._tail(job))
        for other in self.jobs if stalled else ():
            tail = self._tail(other, CAUSE_TAIL_LINES)
            named = known_cause(tail, other.rank, other.host, other.ip, other.iface)
            if named:
                failure = Failure(rank=other.rank, host=other.host, cause=f"{cause}; stopped here{named}",
                                  log_tail="\n".join(tail.splitlines()[-LOG_TAIL_LINES:]))
                break
        if line:
            failure = failure.model_copy(update={
                "cause": cause + known_cause(line, job.rank, job.host, job.ip, job.iface)})
        return self.explain(failure)

    def _poll_round(self, loading: set[int]) -> None:
        """Every node asked (alive and log): the first failure raised, a first log line reported."""
        probes = self.probe(with_logs=True)
        failure = self.first_failure(probes)
        if failure is not None:
            self._fail(self.explain(failure))
        for p in probes:
            if p.log.strip() and p.job.rank not in loading:
                loading.add(p.job.rank)
                self._event(p.job, "loading")

    def explain(self, failure: Failure) -> Failure:
        """The failure, or the node whose private link is down when there is one (see links)."""
        blamed = blame_link(failure, self.fleet, self.jobs)
        if blamed.rank != failure.rank:
            job = self._job(blamed.rank)
            blamed = blamed.model_copy(update={"log_tail": self._tail(job)})
        return blamed

    def _fail(self, failure: Failure) -> None:
        self._event(self._job(failure.rank), "failed", failure.cause)
        raise GroupFailed(failure)

    def _check_after_end(self, rank: int, watch: NodeWatch) -> None:
        """A node's stream says its process ended: one round over every node finds who failed first (the
        wrapper may take a moment to go after writing its exit line); a stream that ended while its process
        still runs is followed again."""
        for _ in range(END_CHECKS):
            probes = self.probe(with_logs=True)
            failure = self.first_failure(probes)
            if failure is not None:
                self._fail(self.explain(failure))
            mine = next((p for p in probes if p.job.rank == rank), None)
            if mine is None or exit_record(mine.log) is None:
                break
            time.sleep(END_CHECK_WAIT_S)
        watch.refollow(rank, delay_s=REFOLLOW_DELAY_S)

    def _tail(self, job: NodeJob, lines: int = LOG_TAIL_LINES) -> str:
        handle = self.handles.get(job.rank)
        if handle is None:
            return ""
        try:
            return self.executor(job.rank).read_log(handle, lines)
        except ExecError:
            return ""

    def stop(self, grace_s: float, log_lines: int = 0) -> dict[int, str]:
        """Stop every started group, one command per node (SIGTERM, up to grace_s, SIGKILL, all on the node),
        each node reported as it is done; with `log_lines`, the end of its log is read right after (into
        `final_logs`). Rank -> outcome."""
        with self._handles_lock:
            self._grace_s = grace_s
            self._stopping.set()  # a start that returns from now on stops its node itself
            handles = dict(self.handles)
        jobs = {j.rank: j for j in self.jobs if j.rank in handles}

        def one(rank: int, ex: Executor) -> str:
            what, log = stop_node(jobs[rank], handles[rank], ex, grace_s, log_lines, self._event)
            if log is not None:
                self.final_logs[rank] = log
            return what

        for job in jobs.values():
            self._event(job, "stopping")
        outs = self.fleet.map(one, jobs)
        return {rank: o.value if o.value is not None else f"unreachable: {o.error}" for rank, o in outs.items()}

    def logs(self, lines: int) -> dict[int, str]:
        """The last `lines` lines of every started node's log (unreachable nodes left out)."""
        outs = self.fleet.map(lambda rank, ex: ex.read_log(self.handles[rank], lines), list(self.handles))
        return {rank: o.value for rank, o in outs.items() if o.value is not None}

    def head_serving(self) -> tuple[bool, str]:
        """Rank 0 answers every readiness path, asked from here or as rank 0 itself sees it (`probe_from`:
        through a port its executor forwards, or on the node)."""
        return self.readiness.serving()
