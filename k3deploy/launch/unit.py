"""A unit of deployment as `launch` starts it and `status`, `stop`, `logs` and `rollout` see it by name: a service
(its router and its instances, each a deployment of its own), else the deployment alone, its own one instance.
The one place that tells the two apart: the commands above it never do."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from k3deploy.executors.factory import ExecutorFactory
from k3deploy.launch import lookup
from k3deploy.launch.events import NodeEvent
from k3deploy.launch.prepare import Unit
from k3deploy.records.deployment import Deployment
from k3deploy.records.service import Service, ServiceStore
from k3deploy.records.store import StateStore

if TYPE_CHECKING:
    from rich.console import RenderableType

    from k3deploy.launch.rollout import ReplicaCheck, Say
    from k3deploy.launch.service_status import ServiceReport
    from k3deploy.launch.streaming import LineSink
    from k3deploy.launch.top import Source
    from k3deploy.planning.plan import Plan


# Where a check's requests go: the instance's record as they should reach it.
Reach = Callable[[Deployment], Deployment]
# An event of one part of the unit: "" for a deployment alone, else the instance's or the router's name.
UnitSink = Callable[[str, NodeEvent], None]


def launch_records(unit: Unit, state_dir: Path | None, *, attach: bool) -> StateStore:
    """Where launch keeps the unit's records: `state_dir`, else launch.state_dir, else the default; InputError for
    --attach of a service (its instances and router have a supervisor each)."""
    if attach and unit.router is not None:
        from k3deploy.errors import InputError

        raise InputError("--attach of replicas behind a router is not built yet",
                         hint=f"launch without --attach, then: k3deploy logs {unit.name} --follow")
    return StateStore.of(unit.plan.topology, state_dir)


def dry_run_json(unit: Unit) -> str:
    """`launch --dry-run --json`: a deployment's node records, or a service's per instance and its router's."""
    import json

    if unit.router is None:
        return json.dumps([j.model_dump(mode="json") for j in unit.jobs], indent=2)
    return json.dumps({"replicas": [[j.model_dump(mode="json") for j in part.jobs] for part in unit.instances],
                       "router": unit.router.jobs[0].model_dump(mode="json")}, indent=2)


def dry_run_view(unit: Unit) -> RenderableType:
    """`launch --dry-run`: every instance's nodes (a service's titled), then its router."""
    from k3deploy.launch.views import dry_run

    return dry_run([(p.title, p.jobs) for p in unit.instances], unit.router.jobs[0] if unit.router else None)


def launch_unit(unit: Unit, store: StateStore, *, on_event: UnitSink, attach: bool,
                skip_preflight: bool) -> Deployment | Service:
    """Start the unit: a deployment alone (supervised in the background, or by the caller with `attach`), or a
    service's instances in parallel and then its router."""
    if unit.router is not None:
        from k3deploy.launch.service import launch_service

        return launch_service(unit, store, on_event=on_event, skip_preflight=skip_preflight)
    from k3deploy.launch import deploy

    return deploy.launch(unit.plan, unit.jobs, store, on_event=lambda e: on_event("", e), background=not attach,
                         preflight_catalog=None if skip_preflight else unit.catalog, skip_preflight=skip_preflight)


def unit_record(store: StateStore, name: str) -> Deployment | Service | None:
    """The unit's record: a service's when one is kept, else the deployment's (None: neither)."""
    return _service(store, name) or store.load(name)


def launch_summary(rec: Deployment | Service) -> str:
    """One paragraph after a launch: the deployment's, or the service's with each instance."""
    if isinstance(rec, Deployment):
        from k3deploy.launch.views import deployment_summary

        return deployment_summary(rec)
    from k3deploy.launch.service_views import summary

    return summary(rec)


class Stopped(NamedTuple):
    """What `stop` did to one node: `part` is the router's or an instance's deployment ("" when alone)."""

    part: str
    rank: int
    host: str
    what: str  # stopped, or why not


class PartLog(NamedTuple):
    """The end of one node's log, with the deployment it belongs to ("" when the unit is that deployment)."""

    part: str
    log: lookup.NodeLog


def _service(store: StateStore, name: str) -> Service | None:
    return ServiceStore(store).load(name)


def unit_status(store: StateStore, name: str, factory: ExecutorFactory) -> lookup.StatusReport | ServiceReport:
    """The unit's record and a live look at its nodes (a service's: each instance beside the router's word)."""
    if _service(store, name) is None:
        return lookup.status(store, name, factory)
    from k3deploy.launch.service_status import service_status

    return service_status(store, name, factory)


def stop_unit(store: StateStore, name: str, factory: ExecutorFactory) -> tuple[str, list[Stopped]]:
    """Stop the unit (a service's router first, then every instance): its status after, and each node's outcome."""
    if _service(store, name) is None:
        from k3deploy.launch import deploy

        dep, outcome = deploy.stop(store, name, factory=factory)
        return dep.status, [Stopped("", rank, _host(store, name, rank), what) for rank, what in sorted(outcome.items())]
    from k3deploy.launch.service import stop_service

    svc, parts = stop_service(store, name, factory=factory)
    return svc.status, [Stopped(part, rank, _host(store, part, rank), what)
                        for part, ranks in parts.items() for rank, what in sorted(ranks.items())]


def _host(store: StateStore, name: str, rank: int) -> str:
    dep = store.load(name)
    return next((j.host for j in dep.jobs if j.rank == rank), "?") if dep is not None else "?"


def unit_logs(store: StateStore, name: str, factory: ExecutorFactory, ranks: list[int] | None,
              lines: int) -> list[PartLog]:
    """The end of each selected node's log (a service's: every instance's, then the router's)."""
    svc = _service(store, name)
    parts = [name] if svc is None else [*(r.name for r in svc.replicas), *((svc.router_name,) if svc.router_name
                                                                             else ())]
    return [PartLog("" if svc is None else part, entry) for part in parts if svc is None or store.load(part)
            for entry in lookup.logs(store, part, factory, ranks, lines)]


def follow_unit(store: StateStore, name: str, sink: LineSink, ranks: Sequence[int] | None, tail_lines: int) -> None:
    """Stream a deployment's node logs until Ctrl-C or they end; a service's instance is followed by its name."""
    from k3deploy.errors import InputError
    from k3deploy.launch.follow import follow

    svc = _service(store, name)
    if svc is not None:
        raise InputError(f"{name} is replicas behind a router: follow one of them",
                         hint=f"k3deploy logs {svc.replicas[0].name} --follow")
    follow(store, name, sink, ranks, tail_lines)


def unit_view(report: lookup.StatusReport | ServiceReport) -> tuple[RenderableType, list[str]]:
    """`status` in the terminal: the view, and lines printed whole after it (a long log path wraps, never cut)."""
    if isinstance(report, lookup.StatusReport):
        from k3deploy.launch.views import status_view

        return status_view(report), [f"rank {n.rank} log: {n.log_path}" for n in report.nodes]
    from k3deploy.launch.service_views import status_view as service_view

    return service_view(report), []


def rollout_unit(unit: Unit, store: StateStore, *, say: Say, drain_s: float,
                 checks_for: Callable[[Sequence[Plan], Reach], Sequence[ReplicaCheck]]) -> Service:
    """Restart the service's instances behind its router one at a time: replicas in turn, or prefill/decode
    instances by role; InputError for a deployment alone (no router keeps anything serving while it restarts).
    `checks_for(instances' plans, reach)` gives each new instance's checks, its requests sent where `reach` points
    its record: a replica's straight to it (before it is back in the router), an instance of a role's through the
    router once it is back (neither role answers a request alone)."""
    if unit.router is None:
        from k3deploy.errors import InputError

        raise InputError(f"{unit.plan.file} has no replicas behind a router: nothing to roll out",
                         hint=f"k3deploy stop {unit.name}, then k3deploy launch {unit.plan.file}")
    plans = [part.plan for part in unit.instances]
    if not unit.roles:
        from k3deploy.launch.rollout import rollout

        return rollout(unit, store, say=say, drain_s=drain_s, checks=checks_for(plans, lambda dep: dep))
    from k3deploy.launch.pd_rollout import rollout_roles

    svc = _service(store, unit.name)

    def through_router(dep: Deployment) -> Deployment:
        # Logs and liveness stay the instance's own.
        return dep.model_copy(update={"url": svc.router_url, "probe_from": "here"}) if svc is not None else dep

    return rollout_roles(unit, store, say=say, drain_s=drain_s, checks=checks_for(plans, through_router))


def launched_from(store: StateStore, name: str) -> Path | None:
    """The topology file the unit was launched from, as its record says (None: no record of it)."""
    rec = unit_record(store, name)
    return Path(rec.file) if rec is not None else None


def unit_sources(store: StateStore, name: str) -> list[Source]:
    """The pages `top` scrapes of the unit named `name`: each instance's serving URL (a service's, then its
    router's)."""
    from k3deploy.errors import InputError
    from k3deploy.launch.top import Source

    svc = _service(store, name)
    if svc is not None:
        out = []
        for r in svc.replicas:
            dep = store.load(r.name)
            out.append(Source(label=r.name, url=r.url, kind="instance", file=dep.file if dep else svc.file,
                              unreachable=_not_here(dep.probe_from) if dep else ""))
        return [*out, Source(label="router", url=_router_metrics_url(svc.router_url, svc.file), kind="router")]
    dep = store.load(name)
    if dep is None:
        raise InputError(f"no deployment or service named {name!r} in {store.directory}",
                         hint="k3deploy status NAME|FILE names what is recorded")
    if not dep.url:
        raise InputError(f"{name} serves no HTTP URL to read /metrics from")
    return [Source(label=name, url=dep.url, kind="instance", file=dep.file, unreachable=_not_here(dep.probe_from))]


def _router_metrics_url(router_url: str, file: str) -> str:
    """The router's /metrics base: its own metrics port (smg, sglang-router: router.metrics_port, else port + 1)
    on the router's host; its serving URL when the topology cannot be read."""
    from urllib.parse import urlsplit

    from k3deploy.topology.loader import TopologyError, load_topology

    try:
        router = load_topology(file).topology.router
    except (TopologyError, OSError):
        return router_url
    if router is None:
        return router_url
    parts = urlsplit(router_url)
    return f"{parts.scheme}://{parts.hostname}:{router.metrics_port_or_default}"


def _not_here(probe_from: str) -> str:
    return "" if probe_from == "here" else "its URL answers only on its head node (probe_from: head)"
