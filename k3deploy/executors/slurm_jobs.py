"""The Slurm controller, as the launch of a Slurm deployment asks it: sbatch, scontrol, scancel, from here.

Slurm 22.05 without an accounting database (as the rig runs it): no sacct, so a job is read with
`scontrol show job -o` (one line of KEY=VALUE words), which holds it for MinJobAge after it ends.
"""
from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.errors import ExecError, MissingDependency

CLIENT_TIMEOUT_S = 60.0
# States in which a job will never run again (man squeue, JOB STATE CODES).
# COMPLETING: ending (scontrol shows it until every node has cleaned up), never running again.
ENDED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "DEADLINE", "FAILED", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT"})
# Node states (scontrol's State=, `+` joined flags) that mean the node is going or gone from the job.
BAD_NODE_FLAGS = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWERING_DOWN", "MAINT")
_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class JobInfo:
    """One job as `scontrol show job` tells it."""

    job_id: int
    state: str  # PENDING, RUNNING, CANCELLED, TIMEOUT, ...
    reason: str  # why pending or why it ended (None when there is nothing to say)
    nodes: tuple[str, ...]  # the allocation's nodes in SLURM_NODEID order (empty while pending)
    time_limit: str
    run_time_s: float | None = None

    @property
    def ended(self) -> bool:
        """The job will not run (again)."""
        return self.state in ENDED_STATES

    @property
    def at_time_limit(self) -> bool:
        """It has run for its whole time limit (Slurm's end of it may still be under way)."""
        limit = duration_s(self.time_limit)
        # The controller checks limits about every 30 s (slurmctld's background loop) and signals first.
        return limit is not None and self.run_time_s is not None and self.run_time_s >= limit - 1


def duration_s(text: str) -> float | None:
    """[D-]HH:MM:SS, MM:SS or minutes as scontrol prints them; None for UNLIMITED or anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_fields(line: str) -> dict[str, str]:
    """KEY=VALUE words of one `scontrol -o` line (a value never holds a space in the fields read here)."""
    return dict(_FIELD.findall(line))


class SlurmClient:
    """The Slurm client commands on this machine, against the cluster `slurm_conf` names (else Slurm's own)."""

    def __init__(self, slurm_conf: str | None = None) -> None:
        self.slurm_conf = slurm_conf

    def run(self, argv: Sequence[str], stdin: str | None = None,
            timeout_s: float = CLIENT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """One client command; a missing client is MissingDependency, a hung one ExecError."""
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        try:
            return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s,
                                  check=False, env=env, stdin=None if stdin is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise MissingDependency(f"{argv[0]} not found: launch.executor slurm runs the Slurm client commands "
                                    "here (sbatch, srun, scontrol, scancel)",
                                    hint="run k3deploy on a Slurm login node, or install the client "
                                    "(Debian/Ubuntu: apt-get install slurm-client)") from None
        except subprocess.TimeoutExpired:
            raise ExecError(f"`{' '.join(argv[:3])}` did not answer within {timeout_s:g} s",
                            host="slurmctld") from None

    def submit(self, script: str, extra: Sequence[str] = ()) -> int:
        """sbatch the script text (on stdin); the job id."""
        res = self.run(["sbatch", "--parsable", *extra], stdin=script)
        first = res.stdout.strip().split(";")[0]
        if res.returncode != 0 or not first.isdigit():
            why = res.stderr.strip() or res.stdout.strip()
            hint = None
            if "partition" in why.lower():
                hint = "set launch.slurm.partition to one `sinfo -s` lists (or leave it unset for the default)"
            elif "node" in why.lower() and "configuration" in why.lower():
                hint = "the cluster has no such nodes: check launch.slurm.nodelist, gres and constraint " \
                    "against `sinfo -N -o '%N %G %f'`, and the topology's node count"
            raise ExecError(f"sbatch refused the job: {why[-400:]}", host="slurmctld", hint=hint)
        return int(first)

    def job(self, job_id: int) -> JobInfo | None:
        """The job now, or None when the controller no longer knows it."""
        res = self.run(["scontrol", "-o", "show", "job", str(int(job_id))])
        if res.returncode != 0:
            if "invalid job id" in res.stderr.lower():
                return None
            raise ExecError(f"scontrol show job {job_id}: {res.stderr.strip()[-300:]}", host="slurmctld")
        f = parse_fields(res.stdout)
        nodelist = f.get("NodeList", "")
        nodes = self.hostnames(nodelist) if nodelist and nodelist != "(null)" else ()
        return JobInfo(job_id=int(job_id), state=f.get("JobState", "UNKNOWN"), reason=f.get("Reason", "None"),
                       nodes=nodes, time_limit=f.get("TimeLimit", ""), run_time_s=duration_s(f.get("RunTime", "")))

    def hostnames(self, nodelist: str) -> tuple[str, ...]:
        """A hostlist expression (h[01-04]) as node names, in Slurm's order (which SLURM_NODEID follows)."""
        res = self.run(["scontrol", "show", "hostnames", nodelist])
        if res.returncode != 0:
            raise ExecError(f"scontrol show hostnames {nodelist}: {res.stderr.strip()[-300:]}", host="slurmctld")
        return tuple(res.stdout.split())

    def node_states(self, nodes: Sequence[str]) -> dict[str, tuple[str, str]]:
        """Node -> (State, Reason) for the given nodes."""
        if not nodes:
            return {}
        res = self.run(["scontrol", "-o", "show", "node", ",".join(nodes)])
        if res.returncode != 0:
            raise ExecError(f"scontrol show node: {res.stderr.strip()[-300:]}", host="slurmctld")
        out = {}
        for line in res.stdout.splitlines():
            f = parse_fields(line)
            if "NodeName" in f:
                # Reason is the last field and may hold spaces: everything after `Reason=` up to its [user@time].
                why = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?: \w+=|$)", line)
                out[f["NodeName"]] = (f.get("State", "UNKNOWN"), why.group(1).strip() if why else "")
        return out

    def cancel(self, job_id: int) -> None:
        """scancel the job; a job already ended or forgotten is fine (idempotent)."""
        res = self.run(["scancel", str(int(job_id))])
        text = res.stderr.lower()
        if res.returncode != 0 and not ("already" in text or "invalid job id" in text or "completed" in text):
            raise ExecError(f"scancel {job_id}: {res.stderr.strip()[-300:]}", host="slurmctld",
                            hint=f"cancel it yourself: scancel {job_id}")


def bad_node(state: str) -> str | None:
    """The flag of a node's State (e.g. IDLE+DRAIN, ALLOCATED+DRAIN, DOWN*) that takes it from a job, if any."""
    flags = re.split(r"[+]", state.upper().rstrip("*~#$@%!^-"))
    if state.endswith("*"):  # `*`: the node does not respond (slurmd gone)
        return "NOT_RESPONDING"
    return next((f for f in flags for bad in BAD_NODE_FLAGS if f.startswith(bad)), None)


def job_summary(client: SlurmClient, job_id: int, nodes: Sequence[str]) -> str:
    """One line for `status`: the job's state and reason, and any of its nodes Slurm has taken out."""
    try:
        info = client.job(job_id)
        states = client.node_states(list(nodes)) if info is not None and not info.ended else {}
    except ExecError as exc:
        return f"job {job_id}: the controller did not answer ({exc})"
    if info is None:
        return f"job {job_id}: no longer known to the controller (ended more than MinJobAge ago)"
    why = f" ({info.reason})" if info.reason not in ("None", "") else ""
    on = f" on {','.join(info.nodes)}" if info.nodes else ""
    bad = [f"{node} {state}" + (f" ({reason})" if reason and reason != "none" else "")
           for node, (state, reason) in states.items() if bad_node(state)]
    return f"job {job_id} {info.state}{why}{on}" + (f"; node {', '.join(bad)}" if bad else "")
