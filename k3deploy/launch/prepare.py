"""Launch's preparation, shared by `launch`, `preflight` and `weights`: plan the file (feasible), and make every
node's record (NodeJob) once; what the CLI prints (the secrets warnings) comes back as data; the nodes as their
allocation holds them for the commands that probe them without starting anything."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.catalog.specs import Catalog
from k3deploy.diagnostics import Issue
from k3deploy.errors import InputError
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.plan import Plan
from k3deploy.topology.units import behind_router

if TYPE_CHECKING:
    from k3deploy.launch.service import ServicePlan


@dataclass(frozen=True)
class Prepared:
    """A feasible plan, every node's record (rank 0 first), the catalog, and warnings for the user."""

    plan: Plan
    jobs: tuple[NodeJob, ...]
    catalog: Catalog
    warnings: tuple[Issue, ...]
    service: ServicePlan | None = None  # replicas behind a router: each replica's plan and records


def prepare(file: Path, catalog_dirs: Sequence[Path] | None, overrides: ExecOverrides,
            environ: Mapping[str, str] | None = None) -> Prepared:
    """Plan `file` (InfeasibleError when it cannot run), warn about secrets the nodes will not get, and make
    the per-node records with the executor targets the topology and `overrides` give (with replicas or
    prefill/decode roles: every replica's or instance's, rank 0 of each first, and the service's plan)."""
    from k3deploy.engines.secret_refs import secret_warnings
    from k3deploy.launch.service import service_plan
    from k3deploy.planning.files import catalog_for, require_feasible

    cat = catalog_for(list(catalog_dirs) if catalog_dirs else None)
    plan = require_feasible(file, cat)
    warnings = secret_warnings(plan.topology, os.environ if environ is None else environ, overrides.executor)
    served = behind_router(plan.topology)
    if served and plan.topology.router is None:
        raise InputError(f"{plan.file}: launch of replicas needs a `router` section",
                         hint="add router: {kind: smg} (or the router for the engine)")
    sp = service_plan(plan, overrides, cat)
    jobs = tuple(j for _, rep in sp.replicas for j in rep)
    return Prepared(plan=plan, jobs=jobs, catalog=cat, warnings=tuple(warnings), service=sp if served else None)


def held(plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog) -> contextlib.AbstractContextManager[tuple[NodeJob, ...]]:
    """One deployment's (or a service instance's) nodes for preflight's probes, as their allocation holds them
    (nothing started on them)."""
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.allocation import allocation_for
    from k3deploy.records.files import default_state_dir
    from k3deploy.records.store import StateStore

    t = plan.topology
    out = StateStore(t.launch.state_dir or default_state_dir()).directory / t.name
    return allocation_for(jobs).held(plan, jobs, catalog, out, open_executor)


@contextlib.contextmanager
def held_unit(prep: Prepared) -> Iterator[tuple[NodeJob, ...]]:
    """Every instance's nodes of the unit at once, as their allocations hold them (nothing started on them), in
    `prep.jobs`' order: a static host as it is, a Slurm job's node as a step of a held job (cancelled on the way
    out), so `weights status` and `sync` reach the nodes as preflight's probes do."""
    parts = [(prep.plan, prep.jobs)] if prep.service is None else list(prep.service.replicas)
    with contextlib.ExitStack() as stack:
        yield tuple(j for plan, jobs in parts for j in stack.enter_context(held(plan, jobs, prep.catalog)))
