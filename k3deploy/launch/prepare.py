"""Launch's preparation, shared by `launch`, `preflight`, `weights` and `rollout`: plan the file (feasible) and
work out the unit of deployment once: each instance's plan and node records (NodeJob), a service's router (its
plan and its job fronting every instance), and what the CLI prints (the secrets warnings) as data; the nodes as
their allocation holds them for the commands that probe them without starting anything."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from k3deploy.catalog.specs import Catalog
from k3deploy.diagnostics import Issue
from k3deploy.errors import InputError
from k3deploy.nodeplan.jobs import NodeJob, instance_jobs
from k3deploy.nodeplan.router_job import router_deployment
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.plan import Plan
from k3deploy.topology.units import UnitInstance, behind_router


class UnitPart(NamedTuple):
    """One deployment of the unit: its name in events ("" for a deployment alone), what the dry run heads it
    with ("" alone), its role (prefill | decode; "" for a replica, the router or a deployment alone), its plan
    (its nodes and ports; with roles, its role's) and its nodes' records, rank 0 first."""

    name: str
    title: str
    role: str
    plan: Plan
    jobs: tuple[NodeJob, ...]


@dataclass(frozen=True)
class Unit:
    """A unit of deployment, worked out once: the feasible plan, each instance (a deployment alone: its one), a
    service's router fronting every instance (None alone), the catalog, the executor overrides, the warnings."""

    plan: Plan
    instances: tuple[UnitPart, ...]
    router: UnitPart | None
    catalog: Catalog
    overrides: ExecOverrides
    warnings: tuple[Issue, ...] = ()

    @property
    def name(self) -> str:
        """The unit's name (the topology's)."""
        return self.plan.topology.name

    @property
    def jobs(self) -> tuple[NodeJob, ...]:
        """Every instance's node records, instance by instance (rank 0 of each first)."""
        return tuple(j for part in self.instances for j in part.jobs)

    @property
    def roles(self) -> tuple[str, ...]:
        """With prefill/decode roles: each instance's role; empty for replicas and a deployment alone."""
        return tuple(part.role for part in self.instances) if self.plan.pd is not None else ()

    @property
    def parts(self) -> tuple[UnitPart, ...]:
        """Every deployment of the unit, the router last."""
        return (*self.instances, *((self.router,) if self.router is not None else ()))


def prepare(file: Path, catalog_dirs: Sequence[Path] | None, overrides: ExecOverrides,
            environ: Mapping[str, str] | None = None) -> Unit:
    """Plan `file` (InfeasibleError when it cannot run), warn about secrets the nodes will not get, and work out
    the unit with the executor targets the topology and `overrides` give."""
    from k3deploy.engines.secret_refs import secret_warnings
    from k3deploy.planning.files import catalog_for, require_feasible

    cat = catalog_for(list(catalog_dirs) if catalog_dirs else None)
    plan = require_feasible(file, cat)
    warnings = secret_warnings(plan.topology, os.environ if environ is None else environ, overrides.executor)
    return unit_of(plan, overrides, cat, tuple(warnings))


def unit_of(plan: Plan, overrides: ExecOverrides, catalog: Catalog, warnings: tuple[Issue, ...] = ()) -> Unit:
    """The plan's unit: each instance (a deployment's one, each replica, or each prefill/decode instance) as a
    deployment of its own with its node records, and (replicas or roles) the router fronting every instance;
    InputError for replicas without a `router` section."""
    served = behind_router(plan.topology)
    if served and plan.topology.router is None:
        raise InputError(f"{plan.file}: launch of replicas needs a `router` section",
                         hint="add router: {kind: smg} (or the router for the engine)")
    instances = tuple(_instance(plan, inst, overrides, catalog, served) for inst in plan.instances)
    if not served:
        return Unit(plan, instances, None, catalog, overrides, warnings)
    own, job = router_deployment(plan, overrides)
    return Unit(plan, instances, UnitPart(own.topology.name, "router", "", own, (job,)), catalog, overrides, warnings)


def _instance(plan: Plan, inst: UnitInstance, overrides: ExecOverrides, catalog: Catalog, served: bool) -> UnitPart:
    """One instance and its node records: a deployment alone, unnamed with the unit's plan; a service's, a
    deployment of its own with its plan (its nodes and ports; with roles, its role's)."""
    jobs = instance_jobs(plan, inst, overrides, catalog)
    if not served:
        return UnitPart("", "", "", plan, jobs)
    own = plan if plan.pd is None else plan.pd.prefill.plan if inst.role == "prefill" else plan.pd.decode.plan
    sub = own._replace(file=plan.file, topology=inst.topology, instances=(inst,))
    name = sub.topology.name
    return UnitPart(name, f"{inst.role or 'replica'} {name}", inst.role, sub, jobs)


def held(plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog) -> contextlib.AbstractContextManager[tuple[NodeJob, ...]]:
    """One deployment's (or a service instance's) nodes for preflight's probes, as their allocation holds them
    (nothing started on them)."""
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.allocation import allocation_for

    return allocation_for(jobs).held(plan, jobs, catalog, open_executor)


@contextlib.contextmanager
def held_unit(unit: Unit) -> Iterator[tuple[NodeJob, ...]]:
    """Every instance's nodes of the unit at once, as their allocations hold them (nothing started on them), in
    `unit.jobs`' order: a static host as it is, a Slurm job's node as a step of a held job (cancelled on the way
    out), so `weights status` and `sync` reach the nodes as preflight's probes do."""
    with contextlib.ExitStack() as stack:
        yield tuple(j for part in unit.instances for j in stack.enter_context(held(part.plan, part.jobs,
                                                                                   unit.catalog)))
