"""`preflight` of a unit of deployment: a deployment alone, its nodes' checks; a service, every instance's own
preflight (each replica's, each prefill's and decode's nodes, the same checks launch runs before starting it), all
at once as launch starts them, and the router's machine; one report naming each instance."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from k3deploy.catalog.specs import Catalog
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.launch.bringup import fleet_of
from k3deploy.launch.prepare import Unit, held
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.preflight.report import Report
from k3deploy.preflight.router_check import router_checks
from k3deploy.preflight.runner import run_preflight


def instance_labels(unit: Unit) -> tuple[str, ...]:
    """How the report names each instance: `replica I`, or `prefill J` / `decode K` (counted per role)."""
    if not unit.roles:
        return tuple(f"replica {i}" for i in range(len(unit.instances)))
    return tuple(f"{role} {unit.roles[:i].count(role)}" for i, role in enumerate(unit.roles))


def preflight_unit(unit: Unit, factory: ExecutorFactory = open_executor) -> Report:
    """The unit's preflight: its one deployment's, or (behind a router) every instance's and the router's."""
    if unit.router is None:
        return _instance(unit.plan, unit.jobs, unit.catalog, factory)
    return preflight_service(unit, factory)


def _instance(plan: Plan, jobs: tuple[NodeJob, ...], catalog: Catalog, factory: ExecutorFactory) -> Report:
    """One instance's checks on its nodes, as their allocation holds them (nothing started on them)."""
    with held(plan, jobs, catalog) as placed, fleet_of(placed, factory) as fleet:
        return run_preflight(plan, catalog, placed, fleet)


def preflight_service(unit: Unit, factory: ExecutorFactory = open_executor) -> Report:
    """Every instance's preflight and the router's checks, in parallel; one Report with an entry per instance."""
    assert unit.router is not None and unit.plan.router is not None
    t0 = time.monotonic()
    labels = instance_labels(unit)

    def instance(i: int) -> Report:
        part = unit.instances[i]
        return _instance(part.plan, part.jobs, unit.catalog, factory).model_copy(update={"instance": labels[i]})

    with ThreadPoolExecutor(max_workers=len(unit.instances) + 1, thread_name_prefix="preflight") as pool:
        parts = [pool.submit(instance, i) for i in range(len(unit.instances))]
        own = pool.submit(router_checks, unit.plan.router.settings, unit.router.jobs[0], factory)
        reports = tuple(p.result() for p in parts)
        checks = own.result()
    return Report(name=unit.name, checks=checks, instances=reports, elapsed_s=round(time.monotonic() - t0, 3))
