"""A unit of deployment as `status`, `stop`, `logs` and `rollout` see it by name: a service's record when one is
kept (its router and its instances, each a deployment of its own), else the deployment alone, its own one instance.
The one place that tells the two records apart: the commands above it never do."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from k3deploy.executors.factory import ExecutorFactory
from k3deploy.launch import lookup
from k3deploy.records.service import Service, ServiceStore
from k3deploy.records.store import StateStore

if TYPE_CHECKING:
    from rich.console import RenderableType

    from k3deploy.launch.rollout import ReplicaCheck, Say
    from k3deploy.launch.service import ServicePlan
    from k3deploy.launch.service_status import ServiceReport
    from k3deploy.launch.streaming import LineSink
    from k3deploy.launch.top import Source


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


def rollout_unit(sp: ServicePlan, store: StateStore, *, say: Say, drain_s: float,
                 checks_for: Callable[[str | None], Sequence[ReplicaCheck]]) -> Service:
    """Restart the service's instances behind its router one at a time: replicas in turn, or prefill/decode
    instances by role. `checks_for(router_url)` gives each new instance's checks: a replica is checked straight,
    an instance of a role through the router (neither role answers a request alone)."""
    if not sp.roles:
        from k3deploy.launch.rollout import rollout

        return rollout(sp, store, say=say, drain_s=drain_s, checks=checks_for(None))
    from k3deploy.launch.pd_rollout import rollout_roles

    svc = _service(store, sp.name)
    return rollout_roles(sp, store, say=say, drain_s=drain_s,
                         checks=checks_for(svc.router_url if svc is not None else None))


def launched_from(store: StateStore, name: str) -> Path | None:
    """The topology file the unit was launched from, as its record says (None: no record of it)."""
    rec = _service(store, name) or store.load(name)
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
