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

from k3deploy.errors import K3Error, LaunchError, StateError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.launch import deploy
from k3deploy.launch.events import EventSink, NodeEvent, ignore
from k3deploy.launch.prepare import Unit
from k3deploy.launch.registration import wait_registered
from k3deploy.nodeplan.router_job import fronting_only, router_name
from k3deploy.preflight.router_check import router_gate
from k3deploy.records.deployment import Deployment
from k3deploy.records.service import ReplicaEntry, Service
from k3deploy.records.service_recorder import ServiceRecorder
from k3deploy.records.store import StateStore

ReplicaSink = Callable[[str, NodeEvent], None]


def start_replica(unit: Unit, index: int, store: StateStore, *, factory: ExecutorFactory = open_executor,
                  on_event: EventSink = ignore, skip_preflight: bool = False,
                  tries: int | None = None) -> Deployment:
    """Launch one replica (gang, readiness with a real completion, its own supervisor), trying again within
    the restart budget after a failed start; the last failure is raised."""
    plan, jobs = unit.instances[index].plan, unit.instances[index].jobs
    launch = plan.topology.launch
    budget = tries if tries is not None else 1 + launch.restart.max
    for attempt in range(1, budget + 1):
        try:
            return deploy.launch(plan, jobs, store, factory=factory, on_event=on_event,
                                 preflight_catalog=None if skip_preflight else unit.catalog,
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


def launch_service(unit: Unit, store: StateStore, *, factory: ExecutorFactory = open_executor,
                   on_event: ReplicaSink | None = None, skip_preflight: bool = False) -> Service:
    """The router's checks (unless skipped: nothing starts when one fails), every replica in parallel, then the
    unit's router narrowed to the ready ones; LaunchError when none is ready or the router does not serve (what
    started is stopped). A failed replica is named and left out."""
    t = unit.plan.topology
    router = unit.router
    assert t.router is not None and unit.plan.router is not None and router is not None
    urls = unit.plan.router.settings.worker_urls
    recorder = ServiceRecorder(store, unit.name)
    recorder.created(Service(
        name=unit.name, file=unit.plan.file, status="starting", router_kind=t.router.kind,
        router_url=unit.plan.router.settings.url,
        replicas=tuple(ReplicaEntry(index=i, name=part.name, url=urls[i], role=part.role)
                       for i, part in enumerate(unit.instances)),
        preflight="skipped" if skip_preflight else "none"))
    try:
        if not skip_preflight:  # a taken router port found only after every replica loaded costs their load
            router_gate(unit.name, unit.plan.router.settings, router.jobs[0], recorder.checked, factory)
        ready = _start_replicas(unit, store, recorder, factory, on_event, skip_preflight)
        recorder.fronting(router.name)  # before it starts: a stop finds it
        fronted = [urls[i] for i in ready]
        job = fronting_only(router.jobs[0], unit.plan.router.settings, fronted)
        sink = (lambda e: on_event(router.name, e)) if on_event else ignore
        deploy.launch(router.plan, (job,), store, factory=factory, on_event=sink, skip_preflight=True)
        # In PD mode every request passes a prefill and a decode: one completion through the router shows both.
        served = wait_registered(job, fronted, t.launch.ready_timeout_s, t.router.kind,
                                 rounds=1 if unit.roles else None)
    except BaseException as exc:
        stop_service(store, unit.name, factory=factory, status="failed", cause=str(exc))
        raise
    return recorder.registered(ready, [u in served for u in fronted], time.time())


def _start_replicas(unit: Unit, store: StateStore, recorder: ServiceRecorder, factory: ExecutorFactory,
                    on_event: ReplicaSink | None, skip_preflight: bool) -> list[int]:
    """Each replica in its own thread, each failure named in the record; the indices of the ready ones, or
    LaunchError when nothing can serve: no replica ready, or a role without a ready instance (naming why each
    one that failed did)."""
    def one(i: int) -> str | None:
        name = unit.instances[i].name
        sink = (lambda e: on_event(name, e)) if on_event else ignore
        try:
            start_replica(unit, i, store, factory=factory, on_event=sink, skip_preflight=skip_preflight)
        except K3Error as exc:
            recorder.instance_failed(i, str(exc))
            return str(exc)
        recorder.instance_ready(i)
        return None

    with ThreadPoolExecutor(max_workers=len(unit.instances), thread_name_prefix="replica") as pool:
        results = list(pool.map(one, range(len(unit.instances))))
    ready = [i for i, cause in enumerate(results) if cause is None]
    causes = "; ".join(f"{unit.instances[i].name}: {c}" for i, c in enumerate(results) if c)
    if not unit.roles:
        if not ready:
            raise LaunchError(f"{unit.name}: no replica became ready; " + causes, hint=f"k3deploy logs {unit.name}-r0")
        return ready
    for role in ("prefill", "decode"):
        if not any(unit.roles[i] == role for i in ready):
            first = unit.instances[unit.roles.index(role)].name
            raise LaunchError(f"{unit.name}: no {role} instance became ready (a request needs one of each); "
                              + causes, hint=f"k3deploy logs {first}")
    return ready


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
