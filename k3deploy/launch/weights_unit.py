"""`weights sync` of a prepared unit, as `k3deploy weights sync` and `launch --sync-weights` call it: where the files
come from (a directory here, `HOST:DIR` on a node, or the hub at model.revision), the manifest and its origin
worked out once (checkpoint/origin.py), then the sync to every instance's nodes as their allocation holds them."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from k3deploy.checkpoint.origin import HubPin, make_hint, sync_origin
from k3deploy.errors import InputError
from k3deploy.executors.target import ExecTarget
from k3deploy.extras import require
from k3deploy.launch.allocation import allocation_for
from k3deploy.launch.prepare import Unit, held_unit
from k3deploy.launch.weights import checkpoint_nodes
from k3deploy.launch.weights_sync import Source, SyncReport, run_sync
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan


def node_or_local_source(spec: str, unit: Unit) -> tuple[Source, str | None]:
    """`--from DIR` (this machine) or `--from HOST:DIR` (a node of the unit, which serves it): the source and the
    host of the node that serves it (None: this machine), checked against the topology before any node is held."""
    host, sep, directory = spec.partition(":")
    hosts = [j.target.host for j in unit.jobs]
    if sep and host in hosts:
        if not directory.startswith("/"):
            raise InputError(f"--from {spec}: the directory on {host} must be an absolute path")
        return Source(directory, rank=-1), host
    if sep and not Path(spec).is_dir():
        raise InputError(f"--from {spec}: {host} is not a node of this topology",
                         hint=f"nodes: {', '.join(dict.fromkeys(hosts))}; or a directory on this machine")
    if not Path(spec).is_dir():
        raise InputError(f"--from {spec}: no such directory on this machine")
    return Source(str(Path(spec).resolve())), None


def serving_node(src: Source, host: str, jobs: Sequence[NodeJob]) -> tuple[Source, ExecTarget]:
    """The source node of `--from HOST:DIR` as its allocation holds it: the source with the private IP its server
    listens on, and the target that reaches it."""
    job = next((j for j in jobs if j.target.host == host), None)
    if job is None:
        setting = allocation_for(jobs).pin_setting()
        pin = f" (or pin the allocation's nodes, {setting})" if setting else ""
        raise InputError(f"--from {host}:{src.directory}: {host} is not among the nodes held for the sync",
                         hint=f"held: {', '.join(dict.fromkeys(j.target.host for j in jobs))}; name one of them{pin}")
    return dataclasses.replace(src, ip=job.ip), job.target


def hub_pin(unit: Unit, staging: Path | None) -> HubPin:
    """`--from hub`'s repo and revision: the catalog's hub repo of the model at model.revision (required: a hub
    sync is pinned), downloaded into `staging` here first when given (which needs the `hub` extra)."""
    t, model = unit.plan.topology, unit.plan.model
    assert model is not None  # a feasible plan knows its model
    if not t.model.revision:
        raise InputError(f"{unit.plan.file}: --from hub needs model.revision, the commit sha to pull",
                         hint=f"set model.revision: SHA (the manifest's revision; {make_hint(model.hub_repo)})")
    if staging is not None:
        require("hub", what="weights sync --from hub --staging DIR")
    return HubPin(model.hub_repo, t.model.revision, staging)


def sync_unit(unit: Unit, source: str, manifest: Path | None, quiet: bool,
              staging: Path | None = None) -> tuple[SyncReport, Unit]:
    """The manifest's files onto every node of the unit from `source` (DIR, HOST:DIR or hub; hub with `staging`:
    downloaded there first): its report, and the unit kept to the nodes the sync filled (its allocation's
    `kept_to`), for a launch that follows it. Replicas behind a router each hold nodes of their own: left as they
    are."""
    if staging is not None and source != "hub":
        raise InputError(f"--staging {staging}: only with --from hub (where the hub download goes here)",
                         hint=f"drop --staging: --from {source} is already a checkpoint directory")
    host, pin = None, None
    if source == "hub":
        pin = hub_pin(unit, staging)
    else:
        src, host = node_or_local_source(source, unit)
    t = unit.plan.topology
    origin = sync_origin(t.validate_.manifest, unit.plan.file, manifest, pin, quiet)
    with held_unit(unit) as jobs:
        nodes = checkpoint_nodes(unit, jobs)
        kept = unit if unit.router is not None else _kept_to(unit, allocation_for(unit.jobs).kept_to(unit.plan, jobs))
        if pin is not None:
            src, target = Source(origin.url or origin.directory or "", url=origin.url), None
        elif host is not None:
            src, target = serving_node(src, host, jobs)
        else:
            target = None
        return run_sync(t.launch.log_dir, nodes, origin.manifest, src, target, quiet), kept


def _kept_to(unit: Unit, plan: Plan) -> Unit:
    """A deployment alone with its allocation kept to `plan` (the unit's and its one instance's plan)."""
    return dataclasses.replace(unit, plan=plan, instances=(unit.instances[0]._replace(plan=plan),))
