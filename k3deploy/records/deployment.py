"""The record of one deployment (one instance of a unit): its node jobs, nodes, attempts and failure."""
from __future__ import annotations

import time
from typing import Literal

from pydantic import Field

from k3deploy.executors.base import ProcessHandle
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.owner import Identity
from k3deploy.records.record import Record
from k3deploy.records.status import Status

NodePhase = Literal["pending", "started", "ready", "exited", "stopped", "unreachable", "unknown"]


class NodeState(Record):
    """One node of the running group."""

    rank: int
    host: str
    phase: NodePhase = "pending"
    handle: ProcessHandle | None = None


class Failure(Record):
    """Why the group was torn down: the node that failed first (None for deadline or interrupt)."""

    rank: int | None
    host: str | None
    cause: str
    log_tail: str = ""
    at: float = Field(default_factory=time.time)


class Attempt(Record):
    """One start of the whole group."""

    number: int
    started_at: float
    ready_at: float | None = None
    ended_at: float | None = None
    cause: str | None = None


class SlurmJob(Record):
    """The Slurm job a deployment runs in (launch.executor slurm): stopped with it (scancel)."""

    job_id: int
    slurm_conf: str | None = None
    nodes: tuple[str, ...] = Field((), description="the allocation's nodes in SLURM_NODEID (= rank) order")
    batch_log: str | None = Field(None, description="the batch script's output (sbatch --output), on node 0")


class Deployment(Record):
    """Everything `status`, `logs`, `stop` and the supervisor need, without the topology file."""

    name: str
    file: str
    plan_digest: str
    executor: str
    status: Status
    created_at: float
    ready_at: float | None = None
    url: str | None = None
    ready_paths: tuple[str, ...] = ()
    probe_from: Literal["here", "head"] = "here"
    stop_grace_s: float
    ready_timeout_s: float
    restart_max: int = 0
    restart_backoff_s: float = 30.0
    jobs: tuple[NodeJob, ...]
    nodes: tuple[NodeState, ...]
    owner: Identity | None = None
    failure: Failure | None = None
    attempts: tuple[Attempt, ...] = ()
    # Records written before preflight existed load as "none".
    preflight: Literal["passed", "failed", "skipped", "none"] = Field(
        "none", description="the preflight before the first start: passed, failed, skipped (--skip-preflight)")

    slurm_job: SlurmJob | None = Field(None, description="the Slurm job it runs in, once submitted")

    def with_node(self, rank: int, **changes: object) -> Deployment:
        """A copy with one node's fields changed."""
        nodes = tuple(n.model_copy(update=changes) if n.rank == rank else n for n in self.nodes)
        return self.model_copy(update={"nodes": nodes})

    def end_attempt(self, cause: str | None) -> Deployment:
        """A copy whose last attempt is closed with `cause`."""
        if not self.attempts or self.attempts[-1].ended_at is not None:
            return self
        last = self.attempts[-1].model_copy(update={"ended_at": time.time(), "cause": cause})
        return self.model_copy(update={"attempts": (*self.attempts[:-1], last)})


