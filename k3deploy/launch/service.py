"""Replicas behind a router: each replica an ordinary supervised deployment (NAME-rI, its own gang, record and
supervisor), started in parallel; then the router (NAME-router, a one-node deployment) fronting every replica
that became ready; one service record lists them. The per-replica start and stop are what a rollout calls.
Prefill/decode roles are the same machinery: each instance a deployment (NAME-prefill0, NAME-decode0, ...),
then the router in PD mode fronting the ready ones (at least one of each role)."""
from __future__ import annotations

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
from k3deploy.nodeplan.router_job import router_deployment, router_name
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Deployment
from k3deploy.records.service import ReplicaEntry, Service
from k3deploy.records.service_recorder import ServiceRecorder
from k3deploy.records.store import StateStore

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
    t = sp.plan.topology
    assert t.router is not None and sp.plan.router is not None
    urls = sp.plan.router.settings.worker_urls
    recorder = ServiceRecorder(store, sp.name)
    recorder.created(Service(
        name=sp.name, file=sp.plan.file, status="starting", router_kind=t.router.kind,
        router_url=sp.plan.router.settings.url,
        replicas=tuple(ReplicaEntry(index=i, name=p.topology.name, url=urls[i],
                                    role=sp.roles[i] if sp.roles else "") for i, (p, _) in enumerate(sp.replicas)),
        preflight="skipped" if skip_preflight else "none"))
    try:
        if not skip_preflight:  # a taken router port found only after every replica loaded costs their load
            router_gate(sp.plan, sp.overrides, recorder.checked, factory)
        failed = _start_replicas(sp, store, recorder, factory, on_event, skip_preflight)
        ready = [i for i in range(len(sp.replicas)) if i not in failed]
        _require_ready(sp, ready, failed)
        recorder.fronting(router_name(sp.name))  # before it starts: a stop finds it
        fronted = [urls[i] for i in ready]
        plan, job = router_deployment(sp.plan, fronted, sp.overrides)
        sink = (lambda e: on_event(plan.topology.name, e)) if on_event else ignore
        deploy.launch(plan, (job,), store, factory=factory, on_event=sink, skip_preflight=True)
        # In PD mode every request passes a prefill and a decode: one completion through the router shows both.
        served = wait_registered(job, fronted, t.launch.ready_timeout_s, t.router.kind,
                                 rounds=1 if sp.roles else None)
    except BaseException as exc:
        stop_service(store, sp.name, factory=factory, status="failed", cause=str(exc))
        raise
    return recorder.registered(ready, [u in served for u in fronted], time.time())


def _start_replicas(sp: ServicePlan, store: StateStore, recorder: ServiceRecorder, factory: ExecutorFactory,
                    on_event: ReplicaSink | None, skip_preflight: bool) -> dict[int, str]:
    """Each replica in its own thread; returns why each one that failed did (by index), each named in the
    record."""
    def one(i: int) -> str | None:
        name = sp.replicas[i][0].topology.name
        sink = (lambda e: on_event(name, e)) if on_event else ignore
        try:
            start_replica(sp, i, store, factory=factory, on_event=sink, skip_preflight=skip_preflight)
        except K3Error as exc:
            recorder.instance_failed(i, str(exc))
            return str(exc)
        recorder.instance_ready(i)
        return None

    with ThreadPoolExecutor(max_workers=len(sp.replicas), thread_name_prefix="replica") as pool:
        results = list(pool.map(one, range(len(sp.replicas))))
    return {i: cause for i, cause in enumerate(results) if cause is not None}


def _require_ready(sp: ServicePlan, ready: list[int], failed: dict[int, str]) -> None:
    """LaunchError when nothing can serve: no replica ready, or a role without a ready instance (`failed`:
    why each one that failed did, by index)."""
    causes = "; ".join(f"{sp.replicas[i][0].topology.name}: {c}" for i, c in sorted(failed.items()) if c)
    if not sp.roles:
        if not ready:
            raise LaunchError(f"{sp.name}: no replica became ready; " + causes, hint=f"k3deploy logs {sp.name}-r0")
        return
    for role in ("prefill", "decode"):
        if not any(sp.roles[i] == role for i in ready):
            first = sp.replicas[sp.roles.index(role)][0].topology.name
            raise LaunchError(f"{sp.name}: no {role} instance became ready (a request needs one of each); "
                              + causes, hint=f"k3deploy logs {first}")


def stop_service(store: StateStore, name: str, *, factory: ExecutorFactory = open_executor,
                 status: str = "stopped", cause: str = "") -> tuple[Service, dict[str, dict[int, str]]]:
    """The router first (no request is sent to a replica going away), then every replica in parallel; the
    service record says `stopping` throughout, so a crash midway leaves a record `stop` finishes. Idempotent."""
    recorder = ServiceRecorder(store, name)
    svc = recorder.stopping()
    stages: Sequence[Sequence[str]] = ([svc.router_name or router_name(name)], [r.name for r in svc.replicas])
    outcome: dict[str, dict[int, str]] = {}
    lock = threading.Lock()

    def one(part: str) -> None:
        got = stop_deployment(store, part, factory)
        with lock:
            outcome[part] = got

    with ThreadPoolExecutor(max_workers=max(1, len(svc.replicas)), thread_name_prefix="stop") as pool:
        for stage in stages:
            list(pool.map(one, stage))
    return recorder.stopped(status, cause), {k: v for k, v in outcome.items() if v}
