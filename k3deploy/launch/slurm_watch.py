"""A Slurm deployment's job as the supervisor, `stop` and teardown see it: a node Slurm took out, the job's
own end (time limit, scancel from outside), and its cancellation once the engines are stopped."""
from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from k3deploy.errors import ExecError
from k3deploy.executors.slurm_jobs import SlurmClient, bad_node
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Failure, SlurmJob


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
