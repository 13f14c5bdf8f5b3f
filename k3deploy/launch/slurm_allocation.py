"""The Slurm allocation (launch.executor slurm): submit the one job text (engines/slurm_job.py), wait until it
runs, take its nodes as the deployment's, start every engine by a go file once preflight has passed, and find
each engine by its tag; then, as the supervisor, `stop` and teardown see the job: a node Slurm took out, the
job's own end (time limit, scancel from outside), and its cancellation once the engines are stopped.

Each task of the job waits for its go file before it starts its engine (detached, logged and tagged as the
other executors start one, then waited for, so the task lasts as long as the engine): preflight runs through
the job's own steps first, and a refused preflight cancels a job that never started anything. After the go,
each node's engine is found by its tag (the session leader carrying it), so the gang's supervision, stop and
logs work on it as on an SSH node's.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shlex
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3deploy.catalog.specs import Catalog
from k3deploy.engines.slurm_job import Wrap, job_text
from k3deploy.errors import ExecError, InputError, LaunchError
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.executors.posix import leader_script, start_script
from k3deploy.executors.slurm_jobs import JobInfo, SlurmClient, bad_node, job_summary
from k3deploy.executors.target import SlurmTarget
from k3deploy.launch.events import GROUP, EventSink, NodeEvent
from k3deploy.launch.gang import Gang
from k3deploy.launch.ipc import with_ipc_dir
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Deployment, Failure, SlurmJob
from k3deploy.records.store import StateStore

# How long a task waits for its go (preflight runs meanwhile) before it gives up and ends the job.
GO_WAIT_S = 900
# How long after its go a node's engine may take to appear (one srun step per look).
HANDLE_WAIT_S = 60.0
POLL_S = 0.5
GO_PREFIX = "/tmp/k3deploy-go-"


def go_file(tag: str) -> str:
    """The file whose creation lets one node's task start its engine (short, whatever the tag)."""
    return GO_PREFIX + hashlib.sha256(tag.encode()).hexdigest()[:16]


def task_wrap(jobs: Sequence[NodeJob], name: str, run_id: str) -> Wrap:
    """Each rank's body run as its task: wait for the go, start it detached and tagged, wait for it."""
    by_rank = {j.rank: j for j in jobs}

    def wrap(rank: int, body: str) -> str:
        job = by_rank[rank]
        tag = job.tag(name, run_id)
        go = shlex.quote(go_file(tag))
        said = shlex.quote(f"k3deploy: rank {rank} on ${{SLURMD_NODENAME:-this node}}: no go within {GO_WAIT_S} s")
        wait = (f"i=0\nwhile [ ! -e {go} ]; do\n  [ $i -lt {GO_WAIT_S * 5} ] || {{ echo {said} >&2; exit 1; }}\n"
                "  sleep 0.2 2>/dev/null || sleep 1\n  i=$((i + 1))\ndone\n"
                f"rm -f {go}\n")
        start = start_script(with_ipc_dir(body, tag), job.log_path, posixpath.dirname(job.log_path) or "/", tag)
        # The task lasts as long as the engine: its exit is the task's, which --kill-on-bad-exit acts on.
        return wait + start + 'exec 1>&- 2>&-\nwait "$p"\n'

    return wrap


def require_no_restarts(plan: Plan) -> None:
    """A Slurm deployment ends with its job: no restart in the same allocation."""
    if plan.topology.launch.restart.max:
        raise InputError(f"{plan.file}: launch.restart.max is {plan.topology.launch.restart.max}, but a Slurm "
                         "deployment is not restarted (its job ends with it)",
                         hint="set launch.restart.max: 0 and launch again after a failure")


def submit(plan: Plan, jobs: Sequence[NodeJob], out_dir: Path, run_id: str, catalog: Catalog) -> SlurmJob:
    """sbatch the deployment's job text (tasks waiting for their go), its output into `out_dir`; the job."""
    inp = plan.render_inputs()
    vendor = catalog.vendors.get(plan.hardware.vendor) if plan.hardware else None
    text = job_text(inp, vendor, gpus=inp.hardware.vendor in ("nvidia", "amd"), wrap=task_wrap(jobs, plan.topology.name, run_id),
                    hold=True)
    conf = os.environ.get("SLURM_CONF")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    job_id = SlurmClient(conf).submit(text, [f"--output={out_dir}/slurm-%j.out", "--chdir=/"])
    return SlurmJob(job_id=job_id, slurm_conf=conf, batch_log=str(out_dir / f"slurm-{job_id}.out"))


def wait_running(job: SlurmJob, timeout_s: float, emit: EventSink) -> JobInfo:
    """Until the job runs; LaunchError naming the job's state and Slurm's reason when it ends or stays pending."""
    client = SlurmClient(job.slurm_conf)
    deadline = time.monotonic() + timeout_s
    said = ""
    info = client.job(job.job_id)
    for _ in range(10**7):
        if info is None or info.ended:
            state = f"{info.state} ({info.reason})" if info else "forgotten by the controller"
            raise LaunchError(f"Slurm job {job.job_id} ended before it ran: {state}{batch_tail(job)}")
        if info.state == "RUNNING" and info.nodes:
            return info
        if info.reason != said:
            said = info.reason
            emit(NodeEvent(GROUP, "", info.state.lower(), f"Slurm job {job.job_id}: {info.reason}"))
        if time.monotonic() > deadline:
            raise LaunchError(f"Slurm job {job.job_id} still {info.state} after {timeout_s:g} s "
                              f"(launch.ready_timeout_s): {info.reason}", hint=pending_hint(info.reason))
        time.sleep(POLL_S)
        info = client.job(job.job_id)
    raise LaunchError(f"Slurm job {job.job_id} never ran")


def pending_hint(reason: str) -> str | None:
    """What to do about the reasons a job waits that a user can act on."""
    hints = {"Resources": "the nodes are busy: wait, or ask for fewer (sinfo shows what is free)",
             "Priority": "other jobs come first: wait, or raise launch.ready_timeout_s",
             "PartitionDown": "the partition is down: ask the admins, or set launch.slurm.partition to one that is up",
             "PartitionNodeLimit": "the partition has fewer nodes than the topology asks: choose another partition",
             "ReqNodeNotAvail": "a node of launch.slurm.nodelist is down, drained or reserved (sinfo -N)",
             "PartitionTimeLimit": "launch.slurm.time_limit is above the partition's MaxTime"}
    return next((h for key, h in hints.items() if reason.startswith(key)), None)


def batch_tail(job: SlurmJob, lines: int = 15) -> str:
    """The end of the batch script's output, when this machine sees it (a shared filesystem)."""
    try:
        text = Path(job.batch_log or "").read_text(errors="replace") if job.batch_log else ""
    except OSError:
        return ""
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return f"\nthe job's output ({job.batch_log}):\n{tail}" if tail else ""


def place(jobs: Sequence[NodeJob], info: JobInfo, job: SlurmJob,
          factory: ExecutorFactory = open_executor) -> tuple[NodeJob, ...]:
    """The jobs on the allocation's nodes (rank = SLURM_NODEID), each with the address its interface has there."""
    if len(info.nodes) != len(jobs):
        raise LaunchError(f"Slurm job {job.job_id} got {len(info.nodes)} node(s), the topology has {len(jobs)}")
    targets = {j.rank: SlurmTarget(host=info.nodes[j.rank], job_id=job.job_id, slurm_conf=job.slurm_conf)
               for j in jobs}
    by_rank = {j.rank: j for j in jobs}
    with NodeFleet(targets, factory) as fleet:
        def address(rank: int, ex: object) -> str:
            iface = shlex.quote(by_rank[rank].iface)
            res = fleet.executor(rank).run(f"ip -4 -o addr show dev {iface} | awk '{{split($4, a, \"/\"); "
                                           "print a[1]; exit}'", timeout_s=60)
            ip = res.stdout.strip()
            if not res.ok or not ip:
                raise ExecError(f"no IPv4 address on interface {by_rank[rank].iface} (the topology's iface of "
                                f"rank {rank}) {res.stderr.strip()[-200:]}", host=targets[rank].host)
            return ip
        outs = fleet.map(address, list(targets))
    for _, o in sorted(outs.items()):
        if not o.ok:
            raise o.error if isinstance(o.error, ExecError) else ExecError(str(o.error), host=o.host)
    ips = {rank: str(o.value) for rank, o in outs.items()}
    head_old, head_new = by_rank[min(by_rank)].ip, ips[min(by_rank)]

    def moved(j: NodeJob) -> NodeJob:
        ready = j.ready
        if ready.url:
            parts = urllib.parse.urlsplit(ready.url)
            if parts.hostname == head_old:
                netloc = f"{head_new}:{parts.port}" if parts.port else head_new
                ready = ready.model_copy(update={"url": parts._replace(netloc=netloc).geturl()})
        return j.model_copy(update={"host": targets[j.rank].host, "ip": ips[j.rank], "target": targets[j.rank],
                                    "ready": ready})

    return tuple(moved(j) for j in sorted(jobs, key=lambda j: j.rank))


def go_and_find(name: str, run_id: str, handles: dict[int, ProcessHandle], fleet: NodeFleet,
                jobs: Sequence[NodeJob], on_started: Callable[[NodeJob, ProcessHandle], None] | None) -> None:
    """Give each node its go (rank 0 first, as the gang starts), and find its engine by tag."""
    by_rank = {j.rank: j for j in jobs}

    def one(rank: int, ex: object) -> ProcessHandle:
        job = by_rank[rank]
        tag = job.tag(name, run_id)
        executor = fleet.executor(rank)
        res = executor.run(f": > {shlex.quote(go_file(tag))}", timeout_s=60)
        if not res.ok:
            raise ExecError(f"cannot give the go: {res.stderr.strip()[-200:]}", host=job.host)
        deadline = time.monotonic() + HANDLE_WAIT_S
        for _ in range(10**6):
            found = executor.run(leader_script(tag), timeout_s=60)
            parts = found.stdout.split()
            if found.ok and parts and parts[0].isdigit():
                handle = ProcessHandle(host=job.host, pid=int(parts[0]), tag=tag, log_path=job.log_path,
                                       start_ticks=int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None)
                handles[rank] = handle
                if on_started is not None:
                    on_started(job, handle)
                return handle
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        raise ExecError(f"its engine (tag {tag}) did not start within {HANDLE_WAIT_S:g} s of the go", host=job.host)

    ranks = sorted(by_rank)
    for group in ([ranks[0]], ranks[1:]):
        for _, o in sorted(fleet.map(one, group, in_pool=True).items()):
            if not o.ok:
                raise o.error if isinstance(o.error, ExecError) else ExecError(str(o.error), host=o.host)


def starter(name: str, run_id: str) -> Callable[[Gang, Callable[[NodeJob, ProcessHandle], None]], None]:
    """The gang's start for a Slurm job's tasks: their go, and each engine found by tag."""
    def start(gang: Gang, on_started: Callable[[NodeJob, ProcessHandle], None]) -> None:
        go_and_find(name, run_id, gang.handles, gang.fleet, gang.jobs, on_started)

    return start


@contextlib.contextmanager
def held_allocation(plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog,
                    factory: ExecutorFactory = open_executor) -> Iterator[tuple[NodeJob, ...]]:
    """A job of the deployment's text whose tasks are never given their go: its nodes, for `preflight`'s
    probes as job steps (its output beside the deployment's records, as a launch's job); cancelled on the way
    out (nothing was started)."""
    t = plan.topology
    job = submit(plan, jobs, StateStore.of(t).directory / t.name, "preflight", catalog)
    try:
        info = wait_running(job, plan.topology.launch.ready_timeout_s, lambda e: None)
        yield place(jobs, info, job, factory)
    finally:
        end_job(job)


def allocate(plan: Plan, jobs: Sequence[NodeJob], store: StateStore, run_id: str, catalog: Catalog,
             factory: ExecutorFactory, emit: EventSink) -> tuple[NodeJob, ...]:
    """Submit, wait until running, place the jobs on its nodes (recorded); on any failure the job is cancelled
    and the record says why (nothing had started: every task still waited for its go)."""
    name = plan.topology.name
    job: SlurmJob | None = None
    try:
        job = submit(plan, jobs, store.directory / name, run_id, catalog)
        submitted = job  # written at once: a stop from another shell cancels it
        store.update(name, lambda d: d.model_copy(update={"slurm_job": submitted}))
        emit(NodeEvent(GROUP, "", "submitted", f"Slurm job {job.job_id}"))
        info = wait_running(job, plan.topology.launch.ready_timeout_s, emit)
        placed = place(jobs, info, job, factory)
    except BaseException as exc:
        left = ""
        if job is not None:
            try:
                end_job(job)
            except ExecError as cancel:
                left = f" (cancelling the job failed: {cancel}; scancel {job.job_id})"
        stopped = isinstance(exc, KeyboardInterrupt)
        cause = ("interrupted; the Slurm job was cancelled" if stopped else str(exc)) + left
        update = {"status": "stopped" if stopped else "failed", "owner": None,
                  "failure": Failure(rank=None, host=getattr(exc, "host", None), cause=cause)}
        store.update(name, lambda d: d.end_attempt(cause).model_copy(update=update))
        raise
    placed_job = job.model_copy(update={"nodes": info.nodes})
    store.update(name, lambda d: d.model_copy(update={
        "slurm_job": placed_job, "jobs": placed, "url": placed[0].ready.url,
        "nodes": tuple(n.model_copy(update={"host": placed[n.rank].host}) for n in d.nodes)}))
    return placed

def node_failure(job: SlurmJob, jobs: Sequence[NodeJob]) -> Failure | None:
    """A node Slurm took from the job (drained, down, not responding), or the job ended: the Failure naming it."""
    client = SlurmClient(job.slurm_conf)
    try:
        info = client.job(job.job_id)
        states = client.node_states([j.host for j in jobs])
    except ExecError:
        return None  # the controller busy or away says nothing about the engines
    for j in sorted(jobs, key=lambda j: j.rank):
        state, reason = states.get(j.host, ("", ""))
        flag = bad_node(state)
        if flag is not None:
            why = f": {reason}" if reason and reason != "none" else ""
            return Failure(rank=j.rank, host=j.host, cause=f"Slurm node {j.host} is {state}{why}")
    if info is None or info.ended:
        state = f"{info.state} ({info.reason})" if info else "forgotten by the controller"
        return Failure(rank=None, host=None, cause=f"Slurm job {job.job_id} ended: {state}")
    return None


def job_said(job: SlurmJob) -> str:
    """`Slurm job J: STATE (reason)` once the job has ended by itself ('' while it runs, or when unknown)."""
    try:
        info = SlurmClient(job.slurm_conf).job(job.job_id)
    except ExecError:
        return ""
    if info is not None and not info.ended:
        return ""  # still running: it is cancelled now, which says nothing about the failure
    return f"Slurm job {job.job_id}: {info.state} ({info.reason})" if info else ""


def end_job(job: SlurmJob) -> None:
    """scancel the job (idempotent): whatever the engines' stop left, Slurm ends."""
    SlurmClient(job.slurm_conf).cancel(job.job_id)


def end_slurm_job(job: SlurmJob, failure: Failure | None) -> tuple[Failure | None, bool]:
    """Cancel the deployment's Slurm job: the failure, with what Slurm says when the job itself had ended, and
    whether Slurm has finished ending it (then no process of it is left on any node, reachable or not)."""
    said = job_said(job)
    try:
        end_job(job)
    except ExecError as exc:
        print(f"k3deploy: {exc}", file=sys.stderr)  # the nodes are stopped; the job's time limit ends it
    if failure is not None and said:
        failure = failure.model_copy(update={"cause": f"{failure.cause}; {said}"})
    return failure, _gone(job)


def _gone(job: SlurmJob, wait_s: float = 30.0) -> bool:
    """Slurm has ended every process of the job (its state is final: no longer COMPLETING)."""
    client = SlurmClient(job.slurm_conf)
    deadline = time.monotonic() + wait_s
    for _ in range(10**6):
        try:
            info = client.job(job.job_id)
        except ExecError:
            return False
        if info is None or (info.ended and info.state != "COMPLETING"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return False


# What srun and slurmstepd write into the batch script's output when Slurm ends a step or job (22.05).
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)
_TASK_ENDED = re.compile(r"^srun: error: (\S+): task (\d+): (.+)$", re.MULTILINE)
_JOB_ENDED = re.compile(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT \S+( DUE TO TIME LIMIT| DUE TO NODE FAILURE)?", re.MULTILINE)


def slurm_explained(job: SlurmJob, failure: Failure, jobs: Sequence[NodeJob]) -> Failure:
    """The failure as Slurm saw it, from the batch output (when this machine sees it): a node failure names
    its node; the time limit or a cancel from outside is said; else the first task srun saw end names its node."""
    try:
        info = SlurmClient(job.slurm_conf).job(job.job_id)
    except ExecError:
        info = None  # the controller away: the batch output may still say
    if info is not None and info.at_time_limit:  # scontrol may still say RUNNING while Slurm ends it
        return failure.model_copy(update={"cause": f"{failure.cause}; Slurm ended job {job.job_id} at its "
                                          "time limit (launch.slurm.time_limit)"})
    try:
        text = Path(job.batch_log).read_text(errors="replace") if job.batch_log else ""
    except OSError:
        return failure
    rank_of = {j.host: j.rank for j in jobs}
    node = _NODE_FAILURE.search(text)
    ended = _JOB_ENDED.search(text)
    task = _TASK_ENDED.search(text)
    if node and node.group(1) in rank_of:
        host = node.group(1)
        return failure.model_copy(update={"rank": rank_of[host], "host": host, "cause": (
            f"Slurm: node failure on {host} (its slurmd stopped answering); the job was ended"
            f" (before: rank {failure.rank} {failure.host}: {failure.cause})")})
    if ended:
        why = {" DUE TO TIME LIMIT": "at its time limit (launch.slurm.time_limit)",
               " DUE TO NODE FAILURE": "for a node failure"}.get(ended.group(1) or "", "by a cancel from outside k3deploy (scancel)")
        return failure.model_copy(update={"cause": f"{failure.cause}; Slurm ended job {job.job_id} {why}"})
    if task and task.group(1) in rank_of and failure.cause.startswith("its process is gone"):
        host = task.group(1)
        return failure.model_copy(update={"rank": rank_of[host], "host": host,
                                          "cause": f"Slurm: task {task.group(2)} on {host}: {task.group(3)} first"})
    return failure


@dataclass(frozen=True)
class SlurmAllocation:
    """The allocation of `launch.executor: slurm`: a job (None until it is submitted) whose nodes are the
    deployment's; the launch seam's strategy (launch/allocation.py)."""

    job: SlurmJob | None

    def check(self, plan: Plan) -> None:
        """A Slurm deployment ends with its job: no restarts."""
        require_no_restarts(plan)

    def allocate(self, plan: Plan, jobs: Sequence[NodeJob], store: StateStore, run_id: str, catalog: Catalog,
                 factory: ExecutorFactory, emit: EventSink) -> tuple[NodeJob, ...]:
        """The job's nodes become the deployment's; its tasks wait for their go (preflight first)."""
        return allocate(plan, jobs, store, run_id, catalog, factory, emit)

    def starter(self, name: str, run_id: str) -> Callable[[Gang, Callable[[NodeJob, ProcessHandle], None]], None]:
        """Each task's go, and its engine found by tag."""
        return starter(name, run_id)

    def held(self, plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog,
             factory: ExecutorFactory) -> contextlib.AbstractContextManager[tuple[NodeJob, ...]]:
        """A job never given its go, for preflight's probes as job steps."""
        return held_allocation(plan, jobs, catalog, factory)

    def node_failure(self, jobs: Sequence[NodeJob]) -> Failure | None:
        """A node drained or down keeps its engine running: Slurm says so."""
        return node_failure(self.job, jobs) if self.job is not None else None

    def explain(self, failure: Failure, jobs: Sequence[NodeJob]) -> Failure:
        """The failure as Slurm saw it."""
        return slurm_explained(self.job, failure, jobs) if self.job is not None else failure

    def release(self, failure: Failure | None) -> tuple[Failure | None, bool]:
        """scancel the job (idempotent: one the supervisor already cancelled is fine)."""
        return end_slurm_job(self.job, failure) if self.job is not None else (failure, False)

    def summary(self) -> str:
        """The job as `scontrol show job` says it (there may be no accounting database for sacct)."""
        return job_summary(SlurmClient(self.job.slurm_conf), self.job.job_id, self.job.nodes) if self.job else ""

    def kept_to(self, plan: Plan, jobs: Sequence[NodeJob]) -> Plan:
        """The next job asks for exactly the nodes `jobs` were on (sbatch --nodelist), which the scheduler could
        otherwise replace; a topology that pins its nodes (launch.slurm.nodelist) already asks for those."""
        t = plan.topology
        if t.launch.slurm.nodelist or not jobs:
            return plan
        slurm = t.launch.slurm.model_copy(update={"nodelist": list(dict.fromkeys(j.target.host for j in jobs))})
        return plan._replace(topology=t.model_copy(update={"launch": t.launch.model_copy(update={"slurm": slurm})}))

    def pin_setting(self) -> str:
        """The job's nodes are the scheduler's choice unless the topology names them."""
        return "launch.slurm.nodelist"


def recorded(dep: Deployment) -> SlurmAllocation | None:
    """The Slurm allocation a record says its deployment runs in, if any."""
    return SlurmAllocation(dep.slurm_job) if dep.slurm_job is not None else None
