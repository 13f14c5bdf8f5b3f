"""`validate` of prefill/decode roles behind a router: the node stages (shards, kernels, topology) on every
instance's own nodes, then the request stages (short, long, prefix-cache, effort) through the router, judged
with decode instance 0's nodes (where generation and the prefix-cache hit happen) as the deployment; effort
judges TTFT and TPOT per role (validate/role_effort.py)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.validate.pipeline import Report
from k3deploy.validate.stage import ProgressEvent, StageResult
from k3deploy.verdicts.model import exit_code

if TYPE_CHECKING:
    from k3deploy.checkpoint.manifest import Manifest
    from k3deploy.launch.state import Deployment
    from k3deploy.validate.run import RunnerFactory, Target

# Stages about one instance's processes and nodes; the others send requests.
NODE_STAGES = ("shards", "kernels", "topology")
NOT_FOR_ROLES = ("effort",)  # not the single-instance stage: role_effort judges it per role


def validate_roles(target: Target, runner_factory: RunnerFactory, names: Sequence[str], *,
                   manifest: Manifest | None, fail_fast: bool, catalog_dirs: Sequence[Path],
                   progress: Callable[[ProgressEvent], None],
                   on_stage: Callable[[str, StageResult | None], None]) -> Report:
    """Run the selected stages `names` (in order) across the roles; each node stage once per instance, named
    `STAGE[INSTANCE]` (e.g. kernels[prefill0]), the request stages once, through the router."""
    from k3deploy.launch.service_state import ServiceStore
    from k3deploy.launch.state import StateStore, default_state_dir
    from k3deploy.topology.pd import instance_topology, instances
    from k3deploy.validate.run import Target as RunTarget
    from k3deploy.validate.run import validate

    t = target.topology
    store = StateStore(t.launch.state_dir or default_state_dir())
    svc = ServiceStore(store).load(t.name)
    running = svc is not None and svc.status in ("ready", "degraded")
    results: list[StageResult] = []
    missing: list[str] = []

    def ready(name: str) -> Deployment | None:
        dep = store.load(name) if running else None
        return dep if dep is not None and dep.status == "ready" else None

    def run(sub: RunTarget, stage_names: list[str], label: str) -> None:
        def named(name: str, result: StageResult | None) -> None:
            on_stage(f"{name}{label}", None if result is None else result.model_copy(update={"name": f"{name}{label}"}))

        rep = validate(sub, runner_factory, manifest=manifest, only=stage_names, fail_fast=fail_fast,
                       catalog_dirs=catalog_dirs, progress=progress, on_stage=named)
        results.extend(r.model_copy(update={"name": f"{r.name}{label}"}) for r in rep.stages)
        missing.extend(n for n in rep.not_implemented if n not in missing)

    insts = instances(t)
    node_names = [n for n in names if n in NODE_STAGES]
    for inst in insts:
        if node_names and not _stopped(results, fail_fast):
            sub = instance_topology(t, inst)
            run(RunTarget(sub, target.file, ready(sub.name)), node_names, f"[{inst.role}{inst.index}]")
    request_names = [n for n in names if n not in NODE_STAGES and n not in NOT_FOR_ROLES]
    if (request_names or "effort" in names) and not _stopped(results, fail_fast):
        decode = next(i for i in insts if i.role == "decode")
        sub = instance_topology(t, decode)
        dep = ready(sub.name)
        if dep is not None and svc is not None:
            # Requests go to the router (it pairs a prefill with a decode); logs and liveness are the decode's.
            dep = dep.model_copy(update={"url": svc.router_url, "probe_from": "here"})
        if request_names:
            run(RunTarget(sub, target.file, dep), request_names, "")
        if "effort" in names and not _stopped(results, fail_fast):
            from k3deploy.validate.role_effort import role_effort

            results += role_effort(t, RunTarget(sub, target.file, dep), runner_factory, manifest=manifest,
                                   catalog_dirs=catalog_dirs, progress=progress, on_stage=on_stage)
    code = exit_code((r.status for r in results), unreachable_first=False)
    return Report(deployment=t.name, passed=code == 0, exit_code=code, stages=results, not_implemented=missing)


def _stopped(results: list[StageResult], fail_fast: bool) -> bool:
    return fail_fast and any(r.status in ("fail", "error") for r in results)
