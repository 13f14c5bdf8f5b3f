"""How a deployment's nodes are obtained: one strategy, chosen by the executor's capabilities (an executor
whose steps run inside a scheduler's job gets a job allocation; static hosts are taken as they are). Launch,
preflight, the supervisor, teardown, stop and status go through this seam and never ask which one it is."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from k3deploy.catalog.specs import Catalog
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.factory import ExecutorFactory
from k3deploy.launch.events import EventSink
from k3deploy.launch.gang import Gang
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Deployment, Failure
from k3deploy.records.store import StateStore

# How the gang's engines are started when the allocation starts them itself (None: the gang starts them).
StartFn = Callable[[Gang, Callable[[NodeJob, ProcessHandle], None]], None]


class Allocation(Protocol):
    """The nodes of one deployment: obtained before bring-up, watched while it runs, released after teardown."""

    def check(self, plan: Plan) -> None:
        """InputError for a topology setting this allocation cannot honour (before any record)."""

    def allocate(self, plan: Plan, jobs: Sequence[NodeJob], store: StateStore, run_id: str, catalog: Catalog,
                 factory: ExecutorFactory, emit: EventSink) -> tuple[NodeJob, ...]:
        """The jobs on the nodes obtained (recorded); on failure the record says why and the nodes are released."""
        ...

    def starter(self, name: str, run_id: str) -> StartFn | None:
        """How the gang's engines start on these nodes (None: as the gang starts them)."""
        ...

    def held(self, plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog,
             factory: ExecutorFactory) -> AbstractContextManager[tuple[NodeJob, ...]]:
        """The nodes held for preflight's probes (nothing started on them), released on the way out."""
        ...

    def node_failure(self, jobs: Sequence[NodeJob]) -> Failure | None:
        """A node the allocation lost while its engine may still run (the supervisor asks each round)."""
        ...

    def explain(self, failure: Failure, jobs: Sequence[NodeJob]) -> Failure:
        """The failure with what the allocation saw of it."""
        ...

    def release(self, failure: Failure | None) -> tuple[Failure | None, bool]:
        """Give the nodes back (idempotent, after every engine is stopped): the failure, with what the
        allocation says of it, and whether no process of the deployment is left on any node."""
        ...

    def summary(self) -> str:
        """One line for `status` ('' when there is nothing to say)."""
        ...

    def kept_to(self, plan: Plan, jobs: Sequence[NodeJob]) -> Plan:
        """The plan whose next allocation gets the nodes `jobs` are on again (a launch after a sync that held
        them: where the weights were copied)."""
        ...

    def pin_setting(self) -> str:
        """The topology setting that pins which nodes this allocation gets ('' when they are the topology's own)."""
        ...


class StaticHosts:
    """The topology's hosts, as they are: the identity allocation."""

    def check(self, plan: Plan) -> None:
        """Static hosts honour every launch setting."""

    def allocate(self, plan: Plan, jobs: Sequence[NodeJob], store: StateStore, run_id: str, catalog: Catalog,
                 factory: ExecutorFactory, emit: EventSink) -> tuple[NodeJob, ...]:
        """The jobs where the topology put them."""
        return tuple(jobs)

    def starter(self, name: str, run_id: str) -> StartFn | None:
        """The gang starts its engines itself."""
        return None

    def held(self, plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog,
             factory: ExecutorFactory) -> AbstractContextManager[tuple[NodeJob, ...]]:
        """The hosts are there already."""
        return contextlib.nullcontext(tuple(jobs))

    def node_failure(self, jobs: Sequence[NodeJob]) -> Failure | None:
        """A host has no one to take it away."""
        return None

    def explain(self, failure: Failure, jobs: Sequence[NodeJob]) -> Failure:
        """Nothing to add."""
        return failure

    def release(self, failure: Failure | None) -> tuple[Failure | None, bool]:
        """Nothing to give back; what the teardown could not stop may still run."""
        return failure, False

    def summary(self) -> str:
        """Nothing to say."""
        return ""

    def kept_to(self, plan: Plan, jobs: Sequence[NodeJob]) -> Plan:
        """The hosts are the topology's: the same ones every time."""
        return plan

    def pin_setting(self) -> str:
        """The topology names its hosts itself."""
        return ""


def allocation_for(jobs: Sequence[NodeJob]) -> Allocation:
    """The allocation the jobs' executor calls for: a scheduler's job when its steps run in one."""
    if jobs and all(j.target.capabilities.runs_in_job for j in jobs):
        from k3deploy.launch.slurm_allocation import SlurmAllocation

        return SlurmAllocation(None)
    return StaticHosts()


def allocation_of(dep: Deployment) -> Allocation:
    """The allocation a deployment's record says it runs in."""
    from k3deploy.launch.slurm_allocation import recorded

    return recorded(dep) or StaticHosts()
