"""The stages against one deployment (or one replica's, one PD instance's): its nodes as one fleet, one report."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from k3deploy.validate.pipeline import Report, run_pipeline
from k3deploy.validate.stage import NodeRef, ProgressEvent, Stage, StageResult, ValidateContext
from k3deploy.validate.target import RunnerFactory, Target

if TYPE_CHECKING:
    from k3deploy.catalog.specs import Catalog
    from k3deploy.checkpoint.manifest import Manifest
    from k3deploy.validate.routed import Routed


def run_stages(target: Target, runner_factory: RunnerFactory, stages: Sequence[Stage], catalog: Catalog, *,
               manifest: Manifest | None, fail_fast: bool, not_implemented: Sequence[str] = (),
               progress: Callable[[ProgressEvent], None], on_stage: Callable[[str, StageResult | None], None],
               routed: Routed | None = None) -> Report:
    """Run `stages` in order against the target's nodes and deployment (requests noted by `routed`, if any)."""
    topology = target.topology
    nodes = [NodeRef(rank, node.host) for rank, node in topology.ordered_nodes()]
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(runner_factory(topology, target.deployment))
        ctx = ValidateContext(name=topology.name, topology=topology, model=catalog.model(topology.model.id),
                              nodes=nodes, fleet=fleet, manifest=manifest, deployment=target.deployment,
                              catalog=catalog, progress=progress, routed=routed)
        return run_pipeline(ctx, stages, fail_fast=fail_fast, not_implemented=not_implemented, on_stage=on_stage)
