"""Launch and stop a deployment: the library calls behind `k3deploy launch` and `k3deploy stop` (bringing a
gang up and tearing it down is in `bringup`)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import Catalog
from k3deploy.errors import LaunchError, StateError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.launch.allocation import allocation_for, allocation_of
from k3deploy.launch.bringup import bring_up, fleet_of, open_gang, record_stopped, teardown
from k3deploy.launch.events import EventSink, ignore
from k3deploy.launch.gang import Gang, new_run_id
from k3deploy.launch.preflight_gate import preflight_gate
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Attempt, Deployment, Failure, NodeState
from k3deploy.records.owner import Identity, start_ticks
from k3deploy.records.status import ACTIVE, Status
from k3deploy.records.store import StateStore
from k3deploy.serving.readiness import ProbeFrom, choose_probe_from

OWNER_EXIT_EXTRA_S = 15.0
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def new_record(plan: Plan, jobs: Sequence[NodeJob], owner: Identity, probe_from: ProbeFrom = "here") -> Deployment:
    """A fresh record in status `starting`."""
    t = plan.topology
    head = min(jobs, key=lambda j: j.rank)
    now = time.time()
    return Deployment(
        name=t.name, file=str(Path(plan.file).resolve()), plan_digest=plan.digest(), executor=head.target.kind,
        status="starting", created_at=now, url=head.ready.url, ready_paths=head.ready.paths, probe_from=probe_from,
        stop_grace_s=t.launch.stop_grace_s, ready_timeout_s=t.launch.ready_timeout_s, restart_max=t.launch.restart.max,
        restart_backoff_s=t.launch.restart.backoff_s, jobs=tuple(jobs),
        nodes=tuple(NodeState(rank=j.rank, host=j.host) for j in jobs), owner=owner,
        attempts=(Attempt(number=1, started_at=now),),
    )  # fmt: skip


def launch(plan: Plan, jobs: Sequence[NodeJob], store: StateStore, *, factory: ExecutorFactory = open_executor,
           on_event: EventSink = ignore, background: bool = True, preflight_catalog: Catalog | None = None,
           skip_preflight: bool = False) -> Deployment:
    """Preflight (unless skipped), bring the deployment up and hand it to a supervisor (background), or
    return with this process as its owner (the caller supervises in the foreground)."""
    name = plan.topology.name
    allocation = allocation_for(jobs)
    allocation.check(plan)
    fleet = fleet_of(jobs, factory)  # an executor kind that cannot work here fails before any record
    head = min(jobs, key=lambda j: j.rank)
    probe_from = choose_probe_from(plan.topology.launch.readiness_probe, head.ready.url)
    gang = Gang(name, jobs, fleet, on_event, probe_from=probe_from)
    ready = False
    try:
        with store.lock(name):
            old = store.load(name)
            if old is not None and old.status in ACTIVE:
                raise StateError(f"deployment {name} is already {old.status} (record {store.path(name)})",
                                 hint=f"stop it first: k3deploy stop {name}")
            record = new_record(plan, jobs, Identity.me("launch"), probe_from)
            store.save(record.model_copy(update={"preflight": "skipped"}) if skip_preflight else record)
        run_id = new_run_id()
        placed = allocation.allocate(plan, jobs, store, run_id, preflight_catalog or load_catalog(), factory, on_event)
        if placed != tuple(jobs):  # the nodes the allocation gave are reached (and asked for readiness) there
            jobs = placed
            gang.close()
            gang = Gang(name, jobs, fleet_of(jobs, factory), on_event, probe_from=choose_probe_from(
                plan.topology.launch.readiness_probe, jobs[0].ready.url))
            store.update(name, lambda d: d.model_copy(update={"probe_from": gang.probe_from}))
        gate = None if skip_preflight else preflight_gate(plan, preflight_catalog or load_catalog(), jobs, store)
        bring_up(gang, store, plan.topology.launch.ready_timeout_s, before_start=gate,
                 start=allocation.starter(name, run_id))
        ready = True
    finally:
        try:
            gang.close()
        except BaseException:
            # Ctrl-C while the connections close after ready: nobody would watch the nodes.
            if ready:
                _unwatched(store, name, factory, on_event, "interrupted; every started node was stopped")
            raise
    if not background:
        return store.update(name, lambda d: d.model_copy(update={"owner": Identity.me("attach")}))
    proc: subprocess.Popen[bytes] | None = None
    try:
        with store.lock(name):
            try:
                proc = spawn_supervisor(store, name)
            except OSError as exc:
                error = exc
            if proc is not None:
                dep = store.require(name).model_copy(update={"owner": Identity(
                    pid=proc.pid, start_ticks=start_ticks(proc.pid), role="supervisor")})
                store.save(dep)
                return dep
    except BaseException:
        # Ctrl-C between ready and the supervisor owning the record: the supervisor (which waits to be
        # recorded as owner) is ended, and the nodes are stopped, as for a Ctrl-C at any earlier moment.
        if proc is not None:
            proc.kill()
            proc.wait()
        _unwatched(store, name, factory, on_event, "interrupted; every started node was stopped")
        raise
    # Nobody would watch it: an unsupervised gang is exactly what launch must never leave behind.
    _unwatched(store, name, factory, on_event, f"cannot start the supervisor: {error}", status="failed")
    raise LaunchError(f"cannot start the supervisor of {name}: {error}; every node was stopped")


def _unwatched(store: StateStore, name: str, factory: ExecutorFactory, on_event: EventSink, cause: str,
               status: Status = "stopped") -> None:
    """Stop a ready gang that no supervisor will watch, recording why."""
    gang = open_gang(store.require(name), factory, on_event)
    try:
        teardown(gang, store, Failure(rank=None, host=None, cause=cause), status=status, release_owner=True)
    finally:
        gang.close()


def spawn_supervisor(store: StateStore, name: str) -> subprocess.Popen[bytes]:
    """`python -m k3deploy.launch.supervisor STATE_FILE` in its own session, output to a local log."""
    log = store.directory / f"{name}.supervisor.log"
    env = dict(os.environ)
    # The same k3deploy as this process, installed or not (the supervisor runs from /).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_PARENT), env.get("PYTHONPATH", "")) if p)
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "k3deploy.launch.supervisor", str(store.path(name))],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, cwd="/", env=env,
        )  # fmt: skip


def stop(store: StateStore, name: str, *, factory: ExecutorFactory = open_executor,
         on_event: EventSink = ignore) -> tuple[Deployment, dict[int, str]]:
    """Stop the owner, which stops the nodes over its live connections as it goes (a record in `stopping`
    tells it to), then whatever recorded node it did not stop; idempotent."""
    with store.lock(name):
        dep = store.require(name)
        final_status: Status = "stopped" if dep.status in ACTIVE else dep.status
        if dep.status in ACTIVE:
            dep = dep.model_copy(update={"status": "stopping"})
            store.save(dep)
    owner = dep.owner
    if owner is not None and owner.alive() and not owner.terminate(dep.stop_grace_s + OWNER_EXIT_EXTRA_S):
        raise StateError(f"the {owner.role} process {owner.pid} of {name} did not exit")
    dep = store.require(name)  # the owner may have recorded new handles, or stopped the nodes, before it went
    started = [n for n in dep.nodes if n.handle is not None]
    outcome = {n.rank: "stopped" for n in started if n.phase == "stopped"}
    left = [n.rank for n in started if n.phase != "stopped"]
    if left:
        gang = open_gang(dep, factory, on_event, ranks=left)
        try:
            outcome |= teardown(gang, store, None, status=final_status, release_owner=True)
        finally:
            gang.close()
    else:
        allocation_of(dep).release(None)  # idempotent: nodes the supervisor already gave back are fine
        if dep.status in ACTIVE:  # e.g. the owner was ended between a restart's stop and its next start
            record_stopped(store, name, None, final_status, {}, release_owner=True)
    return store.require(name), outcome
