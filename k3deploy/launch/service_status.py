"""`status` of a service: each replica's deployment as k3deploy sees it beside what the router's `/workers`
says of that worker, and the router's own deployment (named when its process is gone)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from k3deploy.engines.router_api import RouterWorker
from k3deploy.executors.factory import ExecutorFactory
from k3deploy.executors.http import NodeHttp
from k3deploy.launch import lookup
from k3deploy.records.service import ServiceStore
from k3deploy.records.status import ACTIVE, InstanceStatus, unit_status
from k3deploy.records.store import StateStore
from k3deploy.serving.router_workers import workers_of


class ReplicaView(BaseModel):
    """One replica: its deployment status, and the router's word on its worker."""

    model_config = ConfigDict(frozen=True)

    name: str
    url: str
    role: str = ""  # prefill | decode with roles
    status: str  # its deployment record's status ("none": never recorded)
    report: lookup.StatusReport | None
    router_healthy: bool | None  # None: the router lists it without a verdict, or could not be asked
    router_says: str  # "healthy (ready, load 0)", "unhealthy", "not registered", "router not answering"
    problem: str = ""  # why this replica is not serving, in words (named by status)


class ServiceReport(BaseModel):
    """`k3deploy status NAME` of replicas behind a router (also its --json)."""

    model_config = ConfigDict(frozen=True)

    name: str
    status: str
    file: str
    router_kind: str
    router_url: str
    router: lookup.StatusReport | None
    router_alive: bool
    workers_error: str
    router_problem: str
    replicas: tuple[ReplicaView, ...]
    cause: str = ""  # why a failed launch failed (the service record's), e.g. the router's preflight
    preflight: str = "none"  # the router's checks before any instance started: passed, failed, skipped


def service_status(store: StateStore, name: str, factory: ExecutorFactory) -> ServiceReport:
    """The service record, a live look at every replica and the router, and the router's `/workers`."""
    svc = ServiceStore(store).load(name)
    assert svc is not None
    active = svc.status in ACTIVE
    router = lookup.status(store, svc.router_name, factory) if svc.router_name and store.load(svc.router_name) \
        else None
    router_alive = router is not None and any(n.alive for n in router.nodes)
    workers, why = ([], "") if not active else _workers(svc.router_url)
    by_url = {w.url: w for w in workers}
    views = []
    for r in svc.replicas:
        rep = lookup.status(store, r.name, factory) if store.load(r.name) is not None else None
        w = by_url.get(r.url.rstrip("/"))
        if not active:
            says, healthy = "-", None
        elif why:
            says, healthy = "router not answering", None
        elif w is None:
            says, healthy = "not registered", None
        else:
            healthy = w.healthy
            says = ("healthy" if w.healthy else "unhealthy" if w.healthy is False else "listed") + (
                f" ({w.status}" + (f", load {w.load}" if w.load is not None else "") + ")" if w.status else "")
        status = rep.status if rep is not None else "none"
        problem = ""
        if active and r.cause:
            problem = f"left out of the router: {r.cause}"
        elif active and rep is not None and rep.status != "ready":
            problem = f"{rep.status}" + (f": rank {rep.failure.rank} ({rep.failure.host}): {rep.failure.cause}"
                                         if rep.failure else "")
        elif active and healthy is False:
            problem = "the router takes it out (health checks fail)"
        views.append(ReplicaView(name=r.name, url=r.url, role=r.role, status=status, report=rep, router_healthy=healthy,
                                 router_says=says, problem=problem))
    router_problem = ""
    if active and router is not None and not router_alive:
        router_problem = f"{svc.router_name}: the router process is not running ({router.status})" + (
            f": {router.failure.cause}" if router.failure else "")
    elif active and why:
        router_problem = f"{svc.router_name}: {why}"
    status = unit_status(svc.status, [InstanceStatus(v.role, not v.problem) for v in views], not router_problem)
    return ServiceReport(name=name, status=status, file=svc.file, router_kind=svc.router_kind,
                         router_url=svc.router_url, router=router, router_alive=router_alive, workers_error=why,
                         router_problem=router_problem, replicas=tuple(views), cause=svc.cause,
                         preflight=svc.preflight)


def _workers(url: str) -> tuple[list[RouterWorker], str]:
    with NodeHttp(url) as http:
        return workers_of(http)
