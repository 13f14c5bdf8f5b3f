"""`validate` of a service, replicas or prefill/decode roles behind a router, on one path: the node stages
(shards, kernels, topology) on every instance's own nodes, named `STAGE[r0]`, `STAGE[prefill0]`, then the request
stages (short, long, prefix-cache, effort) once, through the router. For replicas the router spreads them and
each request stage names the replica that served it; they are judged with the first ready replica's nodes (logs,
liveness). For roles they are judged with decode instance 0's nodes (where generation and the prefix-cache hit
happen), and effort judges TTFT and TPOT per role (validate/role_effort.py)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from k3deploy.validate.pipeline import Report
from k3deploy.validate.routed import Routed, served_line
from k3deploy.validate.single import run_stages
from k3deploy.validate.stage import ProgressEvent, Stage, StageResult
from k3deploy.validate.target import RunnerFactory, Target
from k3deploy.verdicts.model import exit_code

if TYPE_CHECKING:
    from k3deploy.catalog.specs import Catalog
    from k3deploy.checkpoint.manifest import Manifest
    from k3deploy.records.deployment import Deployment
    from k3deploy.records.service import Service
    from k3deploy.topology.schema import Topology

# Stages about one instance's processes and nodes; the others send requests.
NODE_STAGES = ("shards", "kernels", "topology")
OnStage = Callable[[str, "StageResult | None"], None]


@dataclass(frozen=True)
class Unit:
    """One replica or PD instance as its own deployment."""

    label: str  # r0, prefill0: the suffix of its node stages' names
    topology: Topology  # its own (named NAME-r0, NAME-prefill0: its deployment record)
    judges_requests: bool  # may stand for the service when request stages are judged (logs, liveness)


def units(t: Topology) -> list[Unit]:
    """The service's instances in launch order."""
    if t.roles is not None:
        from k3deploy.topology.pd import instance_topology, instances

        return [Unit(f"{i.role}{i.index}", instance_topology(t, i), i.role == "decode") for i in instances(t)]
    from k3deploy.topology.replicas import replica_topology

    return [Unit(f"r{i}", replica_topology(t, i), True) for i in range(t.replicas)]


def _routed(t: Topology, svc: Service | None) -> Routed | None:
    """Who serves through the router, for replicas (roles: a request is served by a prefill and a decode)."""
    from k3deploy.engines.router_api import SERVED_BY_HEADER

    if t.roles is not None or svc is None:
        return None
    return Routed({r.url.rstrip("/"): r.name for r in svc.replicas}, SERVED_BY_HEADER.get(svc.router_kind))


def validate_service(target: Target, runner_factory: RunnerFactory, stages: Sequence[Stage], catalog: Catalog, *,
                     manifest: Manifest | None, fail_fast: bool, not_implemented: Sequence[str],
                     progress: Callable[[ProgressEvent], None], on_stage: OnStage) -> Report:
    """Each selected node stage once per instance, then the request stages once, through the router."""
    from k3deploy.records.files import default_state_dir
    from k3deploy.records.service import ServiceStore
    from k3deploy.records.store import StateStore

    t = target.topology
    store = StateStore(t.launch.state_dir or default_state_dir())
    svc = ServiceStore(store).load(t.name)
    running = svc is not None and svc.status in ("ready", "degraded")
    results: list[StageResult] = []
    missing = list(not_implemented)

    def ready(name: str) -> Deployment | None:
        dep = store.load(name) if running else None
        return dep if dep is not None and dep.status == "ready" else None

    def run(sub: Target, chosen: list[Stage], label: str, routed: Routed | None = None) -> None:
        marks: dict[str, tuple[int, dict[str, float] | None]] = {}
        done: dict[str, StageResult] = {}

        def named(name: str, result: StageResult | None) -> None:
            if result is None:
                if routed is not None:
                    marks[name] = routed.mark()
                on_stage(f"{name}{label}", None)
                return
            result = result.model_copy(update={"name": f"{name}{label}"})
            if routed is not None and result.status != "skip" and name in marks:
                result = _served(result, routed, routed.since(marks[name]))
            done[name] = result
            on_stage(result.name, result)

        rep = run_stages(sub, runner_factory, chosen, catalog, manifest=manifest, fail_fast=fail_fast,
                         progress=progress, on_stage=named, routed=routed)
        results.extend(done.get(r.name, r.model_copy(update={"name": f"{r.name}{label}"})) for r in rep.stages)

    everyone = units(t)
    node_stages = [s for s in stages if s.name in NODE_STAGES]
    for unit in everyone:
        if node_stages and not _stopped(results, fail_fast):
            run(Target(unit.topology, target.file, ready(unit.topology.name)), node_stages, f"[{unit.label}]")
    request_stages = [s for s in stages if s.name not in NODE_STAGES]
    if t.roles is not None:
        from k3deploy.validate.role_effort import RoleEffortStage

        # One instance's prediction has no prefill/transfer/decode path: effort is judged per role instead.
        request_stages = [RoleEffortStage(t) if s.name == "effort" else s for s in request_stages]
    if request_stages and not _stopped(results, fail_fast):
        judges = [u for u in everyone if u.judges_requests]
        front = next((u for u in judges if ready(u.topology.name) is not None), judges[0])
        dep = ready(front.topology.name)
        if dep is not None and svc is not None:
            # Requests go to the router; logs and liveness are the judging instance's.
            dep = dep.model_copy(update={"url": svc.router_url, "probe_from": "here"})
        run(Target(front.topology, target.file, dep), request_stages, "", _routed(t, svc) if dep else None)
    code = exit_code((r.status for r in results), unreachable_first=False)
    return Report(deployment=t.name, passed=code == 0, exit_code=code, stages=results, not_implemented=missing)


def _served(result: StageResult, routed: Routed, names: list[str]) -> StageResult:
    """The stage's result naming the replicas that served its requests."""
    line = served_line(names)
    counts = {n: names.count(n) for n in sorted(set(names))}
    return result.model_copy(update={
        "detail": f"{result.detail}; {line}", "evidence": f"{line} ({routed.how})\n{result.evidence}".rstrip(),
        "results": {**result.results, "served_by": counts}})


def _stopped(results: list[StageResult], fail_fast: bool) -> bool:
    return fail_fast and any(r.status in ("fail", "error") for r in results)
