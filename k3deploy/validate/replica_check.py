"""One validate stage on one replica or prefill/decode instance that rollout has just started: a replica's
straight to it, before it is put back; an instance's through the router once it is back (neither role answers a
request alone), judged with the instance's own nodes (logs, liveness)."""
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
    from k3deploy.records.store import StateStore


def replica_stage(instances: Sequence[Plan], catalog: Catalog, store: StateStore, stage: str,
                  runner_factory: RunnerFactory | None = None,
                  router_url: str | None = None) -> Callable[[int], str | None]:
    """A check of replica (or instance) I of `instances` (each one's plan) by `stage`: None when it passed, else
    its status and detail. With `router_url` its requests go through the router."""
    from k3deploy.validate.nodes import fleet_runner

    def check(index: int) -> str | None:
        sub = instances[index].topology
        dep = store.require(sub.name)
        if router_url is not None:
            dep = dep.model_copy(update={"url": router_url, "probe_from": "here"})
        report = run_stages(Target(sub, Path(instances[index].file), dep), runner_factory or fleet_runner,
                            [IMPLEMENTED[stage]], catalog, manifest=None, fail_fast=True,
                            progress=lambda e: None, on_stage=lambda n, r: None)
        result = report.stages[0]
        return None if result.status == "pass" else f"{result.status}: {result.detail}"

    return check
