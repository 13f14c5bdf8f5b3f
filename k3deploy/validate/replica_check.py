"""One validate stage on one replica or prefill/decode instance that rollout has just started, its requests sent
where rollout points them (a replica's straight to it, an instance of a role's through the router), judged with
the instance's own nodes (logs, liveness)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.validate.stages import IMPLEMENTED
from k3deploy.validate.target import RunnerFactory, Target
from k3deploy.validate.unit import run_stages

if TYPE_CHECKING:
    from k3deploy.catalog.specs import Catalog
    from k3deploy.planning.plan_model import Plan
    from k3deploy.records.deployment import Deployment
    from k3deploy.records.store import StateStore


def replica_stage(instances: Sequence[Plan], catalog: Catalog, store: StateStore, stage: str,
                  reach: Callable[[Deployment], Deployment],
                  runner_factory: RunnerFactory | None = None) -> Callable[[int], str | None]:
    """A check of replica (or instance) I of `instances` (each one's plan) by `stage`: None when it passed, else
    its status and detail; its requests go where `reach` points its deployment record."""
    from k3deploy.validate.nodes import fleet_runner

    def check(index: int) -> str | None:
        sub = instances[index].topology
        dep = reach(store.require(sub.name))
        report = run_stages(Target(sub, Path(instances[index].file), dep), runner_factory or fleet_runner,
                            [IMPLEMENTED[stage]], catalog, manifest=None, fail_fast=True,
                            progress=lambda e: None, on_stage=lambda n, r: None)
        result = report.stages[0]
        return None if result.status == "pass" else f"{result.status}: {result.detail}"

    return check
