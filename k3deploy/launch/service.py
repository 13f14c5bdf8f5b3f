"""Replicas behind a router: each replica an ordinary supervised deployment (NAME-rI, its own gang, record and
supervisor), started in parallel; then the router (NAME-router, a one-node deployment) fronting every replica
that became ready; one service record lists them. The per-replica start and stop are what a rollout calls.
Prefill/decode roles are the same machinery: each instance a deployment (NAME-prefill0, NAME-decode0, ...),
then the router in PD mode fronting the ready ones (at least one of each role)."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from k3deploy.catalog.specs import Catalog
from k3deploy.errors import K3Error, LaunchError, StateError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.launch import deploy
from k3deploy.launch.events import EventSink, NodeEvent, ignore
from k3deploy.launch.preflight_gate import router_gate
from k3deploy.launch.registration import wait_registered
from k3deploy.nodeplan.jobs import NodeJob, instance_jobs
from k3deploy.nodeplan.router_job import router_job, router_name
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Deployment
from k3deploy.records.service import ReplicaEntry, Service, ServiceStore
from k3deploy.records.status import ACTIVE
from k3deploy.records.store import StateStore
from k3deploy.topology.replicas import replica_groups, router_node

ReplicaSink = Callable[[str, NodeEvent], None]


@dataclass(frozen=True)
class ServicePlan:
    """What launch needs of a unit: the whole plan, and each instance's plan and node records (a deployment
    without a router: its one)."""

    plan: Plan
    replicas: tuple[tuple[Plan, tuple[NodeJob, ...]], ...]
    overrides: ExecOverrides
    catalog: Catalog
    roles: tuple[str, ...] = ()  # with roles: each entry's role (prefill | decode); empty for replicas

    @property
    def name(self) -> str:
        """The service's name (the topology's)."""
        return self.plan.topology.name


def service_plan(plan: Plan, overrides: ExecOverrides, catalog: Catalog) -> ServicePlan:
    """Each of the plan's instances (a deployment's one, each replica, or each prefill/decode instance) as a
    deployment of its own: its plan (its nodes and ports; with roles, its role's) and its node records."""
    reps = []
    for inst in plan.instances:
        own = plan if plan.pd is None else plan.pd.prefill.plan if inst.role == "prefill" else plan.pd.decode.plan
        sub = own._replace(file=plan.file, topology=inst.topology, instances=(inst,))
        reps.append((sub, instance_jobs(plan, inst, overrides, catalog)))
    return ServicePlan(plan=plan, replicas=tuple(reps), overrides=overrides, catalog=catalog,
                       roles=tuple(inst.role for inst in plan.instances) if plan.pd is not None else ())


def router_plan(sp: ServicePlan) -> Plan:
    """The router as a one-node deployment's plan (its name, file and launch settings)."""
    t = sp.plan.topology
    index = router_node(t)
    node = t.nodes[index if index is not None else replica_groups(t)[0][0]]
    return sp.plan._replace(topology=t.model_copy(update={
        "name": router_name(t.name), "nodes": [node.model_copy(update={"rank": None})], "replicas": 1,
        "replica_nodes": None, "router": None, "roles": None}))


def start_replica(sp: ServicePlan, index: int, store: StateStore, *, factory: ExecutorFactory = open_executor,
                  on_event: EventSink = ignore, skip_preflight: bool = False,
                  tries: int | None = None) -> Deployment:
    """Launch one replica (gang, readiness with a real completion, its own supervisor), trying again within
    the restart budget after a failed start; the last failure is raised."""
    plan, jobs = sp.replicas[index]
    launch = plan.topology.launch
    budget = tries if tries is not None else 1 + launch.restart.max
    for attempt in range(1, budget + 1):
        try:
            return deploy.launch(plan, jobs, store, factory=factory, on_event=on_event,
                                 preflight_catalog=None if skip_preflight else sp.catalog,
                                 skip_preflight=skip_preflight)
        except StateError:
            raise  # already running, or the record cannot be written: another try changes nothing
        except K3Error:
            if attempt == budget:
                raise
            time.sleep(launch.restart.backoff_s)
    raise AssertionError("unreachable")


def stop_deployment(store: StateStore, name: str, factory: ExecutorFactory = open_executor) -> dict[int, str]:
    """Stop one replica or the router (its supervisor, then its nodes); nothing when it was never recorded."""
    if store.load(name) is None:
        return {}
    return deploy.stop(store, name, factory=factory)[1]


def launch_service(sp: ServicePlan, store: StateStore, *, factory: ExecutorFactory = open_executor,
                   on_event: ReplicaSink | None = None, skip_preflight: bool = False) -> Service:
    """The router's checks (unless skipped: nothing starts when one fails), every replica in parallel, then the
    router with the ready ones registered; LaunchError when none is ready or the router does not serve (what
    started is stopped). A failed replica is named and left out."""
    services = ServiceStore(store)
    t = sp.plan.topology
    assert t.router is not None and sp.plan.router is not None
    urls = sp.plan.router.settings.worker_urls
    with services.lock(sp.name):
        old = services.load(sp.name)
        if old is not None and old.status in ACTIVE:
            raise StateError(f"service {sp.name} is already {old.status}",
                             hint=f"stop it first: k3deploy stop {sp.name}")
        for plan, _ in sp.replicas:
            dep = store.load(plan.topology.name)
            if dep is not None and dep.status in ACTIVE:
                raise StateError(f"replica {dep.name} of {sp.name} is already {dep.status}",
                                 hint=f"stop it first: k3deploy stop {dep.name}")
        services.save(Service(
            name=sp.name, file=sp.plan.file, status="starting", router_kind=t.router.kind,
            router_url=sp.plan.router.settings.url,
            replicas=tuple(ReplicaEntry(index=i, name=p.topology.name, url=urls[i],
                                        role=sp.roles[i] if sp.roles else "") for i, (p, _) in
                           enumerate(sp.replicas)), preflight="skipped" if skip_preflight else "none"))
    try:
        if not skip_preflight:  # a taken router port found only after every replica loaded costs their load
            router_gate(sp.plan, sp.overrides, lambda verdict: services.update(
                sp.name, lambda s: s.model_copy(update={"preflight": verdict})), factory)
        ready = _start_replicas(sp, store, services, factory, on_event, skip_preflight)
        _require_ready(sp, ready, services.load(sp.name))
        job = router_job(_fronting(sp, ready), [urls[i] for i in ready], sp.overrides)
        services.update(sp.name, lambda s: s.model_copy(update={"router_name": router_name(sp.name)}))
        sink = (lambda e: on_event(router_name(sp.name), e)) if on_event else ignore
        deploy.launch(router_plan(sp), (job,), store, factory=factory, on_event=sink, skip_preflight=True)
        # In PD mode every request passes a prefill and a decode: one completion through the router shows both.
        served = wait_registered(job, [urls[i] for i in ready], t.launch.ready_timeout_s, t.router.kind,
                                 rounds=1 if sp.roles else None)
    except BaseException as exc:
        stop_service(store, sp.name, factory=factory, status="failed", cause=str(exc))
        raise
    now = time.time()

    def done(s: Service) -> Service:
        for i in ready:
            s = s.with_replica(i, served_through_router=urls[i] in served)
        status = "ready" if len(ready) == len(sp.replicas) else "degraded"
        return s.model_copy(update={"status": status, "ready_at": now})

    return services.update(sp.name, done)


def _start_replicas(sp: ServicePlan, store: StateStore, services: ServiceStore, factory: ExecutorFactory,
                    on_event: ReplicaSink | None, skip_preflight: bool) -> list[int]:
    """Each replica in its own thread; returns the ready ones' indices, the others named in the record."""
    def one(i: int) -> bool:
        name = sp.replicas[i][0].topology.name
        sink = (lambda e: on_event(name, e)) if on_event else ignore
        try:
            start_replica(sp, i, store, factory=factory, on_event=sink, skip_preflight=skip_preflight)
        except K3Error as exc:
            cause = str(exc)
            services.update(sp.name, lambda s: s.with_replica(i, phase="failed", cause=cause))
            return False
        services.update(sp.name, lambda s: s.with_replica(i, phase="ready", cause=""))
        return True

    with ThreadPoolExecutor(max_workers=len(sp.replicas), thread_name_prefix="replica") as pool:
        results = list(pool.map(one, range(len(sp.replicas))))
    return [i for i, ok in enumerate(results) if ok]


def _require_ready(sp: ServicePlan, ready: list[int], svc: Service | None) -> None:
    """LaunchError when nothing can serve: no replica ready, or a role without a ready instance."""
    if not sp.roles:
        if not ready:
            raise LaunchError(f"{sp.name}: no replica became ready; " + _causes(svc), hint=f"k3deploy logs {sp.name}-r0")
        return
    for role in ("prefill", "decode"):
        if not any(sp.roles[i] == role for i in ready):
            first = sp.replicas[sp.roles.index(role)][0].topology.name
            raise LaunchError(f"{sp.name}: no {role} instance became ready (a request needs one of each); "
                              + _causes(svc), hint=f"k3deploy logs {first}")


def _fronting(sp: ServicePlan, ready: list[int]) -> Plan:
    """The plan whose router fronts only the ready instances (PD: its --prefill/--decode lists)."""
    rp = sp.plan.router
    if not sp.roles or rp is None:
        return sp.plan
    urls = {rp.settings.worker_urls[i] for i in ready}
    settings = dataclasses.replace(rp.settings, prefill=tuple(p for p in rp.settings.prefill if p[0] in urls),
                                   decode=tuple(u for u in rp.settings.decode if u in urls))
    return sp.plan._replace(router=rp._replace(settings=settings))


def _causes(svc: Service | None) -> str:
    if svc is None:
        return ""
    return "; ".join(f"{r.name}: {r.cause}" for r in svc.replicas if r.cause)


def stop_service(store: StateStore, name: str, *, factory: ExecutorFactory = open_executor,
                 status: str = "stopped", cause: str = "") -> tuple[Service, dict[str, dict[int, str]]]:
    """The router first (no request is sent to a replica going away), then every replica in parallel; the
    service record says `stopping` throughout, so a crash midway leaves a record `stop` finishes. Idempotent."""
    services = ServiceStore(store)
    svc = services.update(name, lambda s: s.model_copy(update={"status": "stopping"}))
    outcome: dict[str, dict[int, str]] = {}
    router = svc.router_name or router_name(name)
    outcome[router] = stop_deployment(store, router, factory)
    names: Sequence[str] = [r.name for r in svc.replicas]
    lock = threading.Lock()

    def one(rep: str) -> None:
        got = stop_deployment(store, rep, factory)
        with lock:
            outcome[rep] = got

    with ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="stop") as pool:
        list(pool.map(one, names))
    final = "failed" if status == "failed" else "stopped"
    svc = services.update(name, lambda s: s.model_copy(update={
        "status": final, "cause": cause or s.cause,
        "replicas": tuple(r.model_copy(update={"phase": "failed" if r.phase == "failed" else "stopped"})
                          for r in s.replicas)}))
    return svc, {k: v for k, v in outcome.items() if v}
