"""`validate FILE|NAME` as a library call: the topology, its deployment if one runs, the manifest, the stages."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.errors import InputError, StateError
from k3deploy.validate.pipeline import Report, select
from k3deploy.validate.stage import ProgressEvent, StageResult
from k3deploy.validate.stages import IMPLEMENTED
from k3deploy.validate.target import RunnerFactory, Target
from k3deploy.validate.unit import validate_unit

if TYPE_CHECKING:
    from k3deploy.checkpoint.manifest import Manifest
    from k3deploy.topology.schema import Topology


def resolve_target(target: str, state_dir: str | None = None) -> Target:
    """A topology file (with its deployment when one is ready), or a deployment name (StateError if none)."""
    from k3deploy.records.locate import load_topology_file, locate

    found = locate(target, state_dir)
    if found.topology is not None and found.file is not None:
        record = found.store.load(found.name)
        return Target(found.topology, found.file, record if record is not None and record.status == "ready" else None,
                      found.store.directory)
    record = found.store.require(found.name)
    file = Path(record.file)
    if not file.is_file():
        raise StateError(f"deployment {target} was launched from {file}, which is gone",
                         hint="pass the topology file instead of the name")
    return Target(load_topology_file(file), file, record if record.status == "ready" else None, found.store.directory)


def load_manifest(topology: Topology, topology_file: Path, override: Path | None) -> Manifest | None:
    """--manifest, else the topology's validate.manifest (relative to the topology file), else None."""
    from k3deploy.checkpoint.manifest import topology_manifest

    return topology_manifest(topology.validate_.manifest, topology_file, override)


def with_accuracy_dataset(target: Target, override: Path | None) -> Target:
    """The target with the accuracy stage's dataset made absolute: --accuracy-dataset, else the topology's
    validate.accuracy_dataset (relative to the topology file); InputError naming a file that is not there."""
    import dataclasses

    given = target.topology.validate_.accuracy_dataset
    path = override if override is not None else (target.file.parent / given if given else None)
    if path is None:
        return target
    path = path.expanduser().resolve()
    if not path.is_file():
        where = "--accuracy-dataset" if override is not None else f"{target.file}: validate.accuracy_dataset"
        raise InputError(f"{where} {path}: no such file",
                         hint="give a JSON lines file of {\"question\": ..., \"answer\": \"A\"..\"D\"}")
    settings = target.topology.validate_.model_copy(update={"accuracy_dataset": str(path)})
    return dataclasses.replace(target, topology=target.topology.model_copy(update={"validate_": settings}))


def validate(target: Target, runner_factory: RunnerFactory, *, manifest: Manifest | None = None,
             only: Sequence[str] = (), start: str | None = None, skip: Sequence[str] = (), fail_fast: bool = False,
             catalog_dirs: Sequence[Path] = (), progress: Callable[[ProgressEvent], None] = lambda e: None,
             on_stage: Callable[[str, StageResult | None], None] = lambda n, r: None) -> Report:
    """Run the selected stages against a target and return the report (never raises for a finding)."""
    from k3deploy.planning.files import catalog_for

    stages, missing = select(IMPLEMENTED, only, start, skip)
    topology = target.topology
    catalog = catalog_for(list(catalog_dirs))
    if topology.model.id not in catalog.models:
        raise InputError(f"{target.file}: model.id {topology.model.id!r} is not in the catalog "
                         f"(known: {', '.join(sorted(catalog.models))})")
    report = validate_unit(target, runner_factory, stages, catalog, manifest=manifest, fail_fast=fail_fast,
                           not_implemented=missing, progress=progress, on_stage=on_stage)
    if target.deployment is not None and target.state_dir is not None:
        from k3deploy.validate.calibration import keep_effort

        keep_effort(target.state_dir, target.deployment, report)
    return report
