"""`validate` of a unit of deployment, one path for 1..N instances: a deployment alone is its one instance, every
stage against it in one pass. Behind a router (replicas or prefill/decode roles) the node stages (shards,
kernels, topology) run on every instance's own nodes, named `STAGE[r0]`, `STAGE[prefill0]`, then the request
stages (short, long, prefix-cache, effort) once, through the router. For replicas the router spreads them and
each request stage names the replica that served it; they are judged with the first ready replica's nodes (logs,
liveness). For roles they are judged with decode instance 0's nodes (where generation and the prefix-cache hit
happen), and effort judges TTFT and TPOT per role (validate/role_effort.py)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from k3deploy.topology.units import UnitInstance, behind_router, unit_instances
from k3deploy.validate.pipeline import Report, run_pipeline
from k3deploy.validate.routed import Routed
from k3deploy.validate.stage import (
    ALONE,
    Mark,
    NodeRef,
    ProgressEvent,
    Served,
    Stage,
    StageResult,
    ValidateContext,
)
from k3deploy.validate.target import RunnerFactory, Target
from k3deploy.verdicts.model import exit_code

if TYPE_CHECKING:
    from k3deploy.catalog.specs import Catalog
    from k3deploy.checkpoint.manifest import Manifest
    from k3deploy.records.deployment import Deployment
    from k3deploy.records.service import Service
    from k3deploy.records.store import StateStore
    from k3deploy.topology.schema import Topology

# Stages about one instance's processes and nodes; the others send requests.
NODE_STAGES = ("shards", "kernels", "topology")
OnStage = Callable[[str, "StageResult | None"], None]


class Pass(NamedTuple):
    """Some stages against one instance's nodes and deployment, their names suffixed with `label`."""

    target: Target
    stages: list[Stage]
    label: str
    routed: Served = ALONE  # through the router, who served them is noted


def run_stages(target: Target, runner_factory: RunnerFactory, stages: Sequence[Stage], catalog: Catalog, *,
               manifest: Manifest | None, fail_fast: bool, not_implemented: Sequence[str] = (),
               progress: Callable[[ProgressEvent], None], on_stage: Callable[[str, StageResult | None], None],
               routed: Served = ALONE) -> Report:
    """Run `stages` in order against the target's nodes (one fleet) and deployment (requests noted by `routed`)."""
    topology = target.topology
    nodes = [NodeRef(rank, node.host) for rank, node in topology.ordered_nodes()]
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(runner_factory(topology, target.deployment))
        ctx = ValidateContext(name=topology.name, topology=topology, model=catalog.model(topology.model.id),
                              nodes=nodes, fleet=fleet, manifest=manifest, deployment=target.deployment,
                              catalog=catalog, progress=progress, routed=routed)
        return run_pipeline(ctx, stages, fail_fast=fail_fast, not_implemented=not_implemented, on_stage=on_stage)


def validate_unit(target: Target, runner_factory: RunnerFactory, stages: Sequence[Stage], catalog: Catalog, *,
                  manifest: Manifest | None, fail_fast: bool, not_implemented: Sequence[str],
                  progress: Callable[[ProgressEvent], None], on_stage: OnStage) -> Report:
    """Each pass over the unit's instances in turn (none after a failure with `fail_fast`); one report."""
    results: list[StageResult] = []
    for one in _passes(target, stages):
        if _stopped(results, fail_fast):
            break
        results.extend(_run(one, runner_factory, catalog, manifest=manifest, fail_fast=fail_fast,
                            progress=progress, on_stage=on_stage))
    code = exit_code((r.status for r in results), unreachable_first=False)
    return Report(deployment=target.topology.name, passed=code == 0, exit_code=code, stages=results,
                  not_implemented=list(not_implemented))


def _passes(target: Target, stages: Sequence[Stage]) -> Iterator[Pass]:
    """What runs where: alone, every stage on the deployment; behind a router, the node stages per instance,
    then the request stages through the router (judged with a ready instance's nodes)."""
    t = target.topology
    if not behind_router(t):
        yield Pass(target, list(stages), "")
        return
    from k3deploy.records.service import ServiceStore
    from k3deploy.records.store import StateStore

    store = StateStore.of(t, target.state_dir)
    svc = ServiceStore(store).load(t.name)
    running = svc is not None and svc.status in ("ready", "degraded")
    everyone = unit_instances(t)
    node_stages = [s for s in stages if s.name in NODE_STAGES]
    if node_stages:
        for unit in everyone:
            yield Pass(Target(unit.topology, target.file, _ready(store, unit, running)), node_stages,
                       f"[{unit.label}]")
    request_stages, routed = _through_router(t, everyone, svc, [s for s in stages if s.name not in NODE_STAGES])
    if request_stages:
        # Replicas judge requests with any of them; roles with a decode (where generation happens).
        judges = [u for u in everyone if u.role in ("", "decode")]
        front = next((u for u in judges if _ready(store, u, running) is not None), judges[0])
        dep = _ready(store, front, running)
        if dep is not None and svc is not None:
            # Requests go to the router; logs and liveness are the judging instance's.
            dep = dep.model_copy(update={"url": svc.router_url, "probe_from": "here"})
        yield Pass(Target(front.topology, target.file, dep), request_stages, "", routed if dep else ALONE)


def _ready(store: StateStore, unit: UnitInstance, running: bool) -> Deployment | None:
    """The instance's deployment record while the service runs and it is ready."""
    dep = store.load(unit.topology.name) if running else None
    return dep if dep is not None and dep.status == "ready" else None


def _through_router(t: Topology, everyone: Sequence[UnitInstance], svc: Service | None,
                    stages: list[Stage]) -> tuple[list[Stage], Served]:
    """The request stages as the router's requests are judged, and who serves them: replicas each answer a request
    whole (the router names who, when it says); with roles a request passes a prefill and a decode, so effort is
    judged per role (one instance's prediction has no prefill/transfer/decode path) and no one instance served it."""
    from k3deploy.engines.router_api import SERVED_BY_HEADER

    if any(u.role for u in everyone):
        from k3deploy.validate.role_effort import RoleEffortStage

        return [RoleEffortStage(t) if s.name == "effort" else s for s in stages], ALONE
    if svc is None:
        return stages, ALONE
    return stages, Routed({r.url.rstrip("/"): r.name for r in svc.replicas}, SERVED_BY_HEADER.get(svc.router_kind))


def _run(one: Pass, runner_factory: RunnerFactory, catalog: Catalog, *, manifest: Manifest | None, fail_fast: bool,
         progress: Callable[[ProgressEvent], None], on_stage: OnStage) -> list[StageResult]:
    """One pass's results, each named with the pass's label (and who served it, when the router says)."""
    label, routed = one.label, one.routed
    marks: dict[str, Mark] = {}
    done: dict[str, StageResult] = {}

    def named(name: str, result: StageResult | None) -> None:
        if result is None:
            marks[name] = routed.mark()
            on_stage(f"{name}{label}", None)
            return
        result = result.model_copy(update={"name": f"{name}{label}"})
        if result.status != "skip" and name in marks:
            result = routed.served(result, routed.since(marks[name]))
        done[name] = result
        on_stage(result.name, result)

    rep = run_stages(one.target, runner_factory, one.stages, catalog, manifest=manifest, fail_fast=fail_fast,
                     progress=progress, on_stage=named, routed=routed)
    return [done.get(r.name, r.model_copy(update={"name": f"{r.name}{label}"})) for r in rep.stages]


def _stopped(results: list[StageResult], fail_fast: bool) -> bool:
    return fail_fast and any(r.status in ("fail", "error") for r in results)
