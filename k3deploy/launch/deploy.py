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
from k3deploy.launch.bringup import bring_up, fleet_of, open_gang, teardown
from k3deploy.launch.events import EventSink, ignore
from k3deploy.launch.gang import Gang, new_run_id
from k3deploy.launch.preflight_gate import preflight_gate
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Attempt, Deployment, Failure, NodeState
from k3deploy.records.owner import Identity
from k3deploy.records.recorder import Recorder
from k3deploy.records.status import ACTIVE, Status
from k3deploy.records.store import StateStore
from k3deploy.serving.readiness import choose_probe_from

OWNER_EXIT_EXTRA_S = 15.0
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
INTERRUPTED = Failure(rank=None, host=None, cause="interrupted; every started node was stopped")


def new_record(plan: Plan, jobs: Sequence[NodeJob], owner: Identity, skip_preflight: bool = False) -> Deployment:
    """A fresh record in status `starting` (readiness asked from here until the nodes are placed)."""
    t = plan.topology
    head = min(jobs, key=lambda j: j.rank)
    now = time.time()
    return Deployment(
        name=t.name, file=str(Path(plan.file).resolve()), plan_digest=plan.digest(), executor=head.target.kind,
        status="starting", created_at=now, url=head.ready.url, ready_paths=head.ready.paths,
        stop_grace_s=t.launch.stop_grace_s, ready_timeout_s=t.launch.ready_timeout_s, restart_max=t.launch.restart.max,
        restart_backoff_s=t.launch.restart.backoff_s, jobs=tuple(jobs),
        nodes=tuple(NodeState(rank=j.rank, host=j.host) for j in jobs), owner=owner,
        attempts=(Attempt(number=1, started_at=now),), preflight="skipped" if skip_preflight else "none",
    )  # fmt: skip


def launch(plan: Plan, jobs: Sequence[NodeJob], store: StateStore, *, factory: ExecutorFactory = open_executor,
           on_event: EventSink = ignore, background: bool = True, preflight_catalog: Catalog | None = None,
           skip_preflight: bool = False) -> Deployment:
    """Preflight (unless skipped), bring the deployment up and hand it to a supervisor (background), or
    return with this process as its owner (the caller supervises in the foreground)."""
    allocation = allocation_for(jobs)
    allocation.check(plan)
    record = new_record(plan, jobs, Identity.me("launch"), skip_preflight)
    fleet_of(jobs, factory).close()  # an executor kind that cannot work here fails before any record
    recorder = Recorder(store, record.name)
    recorder.created(record)
    run_id = new_run_id()
    catalog = preflight_catalog or load_catalog()
    placed = allocation.allocate(plan, jobs, store, run_id, catalog, factory, on_event)
    # Readiness is asked where the head's URL answers, as the allocation placed it.
    probe_from = choose_probe_from(plan.topology.launch.readiness_probe, placed[0].ready.url)
    gang = Gang(recorder.name, placed, fleet_of(placed, factory), on_event, probe_from=probe_from)
    gate = None if skip_preflight else preflight_gate(plan, catalog, recorder)
    attached: Deployment | None = None  # the ready record, once this process owns it (the caller supervises)
    try:
        dep = recorder.placed(probe_from)
        ready = bring_up(gang, recorder, dep, before_start=gate, start=allocation.starter(recorder.name, run_id))
        # The ready deployment gets its owner while the connections are still open: a hand-off that fails stops
        # the nodes over them, and once a supervisor owns it a Ctrl-C while they close leaves nothing unwatched.
        if not background:
            attached = recorder.owned_by(Identity.me("attach"))
            return attached
        try:
            return recorder.handed_to(lambda: spawn_supervisor(store, recorder.name))
        except OSError as exc:
            error = exc
        except BaseException:
            # Ctrl-C between ready and the supervisor owning the record: the supervisor (which waits to be
            # recorded as owner) is ended, and the nodes are stopped, as for a Ctrl-C at any earlier moment.
            teardown(gang, recorder, ready, INTERRUPTED, status="stopped", release_owner=True)
            raise
        # Nobody would watch it: an unsupervised gang is exactly what launch must never leave behind.
        failure = Failure(rank=None, host=None, cause=f"cannot start the supervisor: {error}")
        teardown(gang, recorder, ready, failure, status="failed", release_owner=True)
        raise LaunchError(f"cannot start the supervisor of {recorder.name}: {error}; every node was stopped")
    finally:
        try:
            gang.close()
        except BaseException:
            # Ctrl-C while the connections of an attached launch close: this process will not watch the nodes.
            if attached is not None:
                _unwatched(recorder, attached, factory, on_event)
            raise


def _unwatched(recorder: Recorder, ready: Deployment, factory: ExecutorFactory, on_event: EventSink) -> None:
    """Stop a ready gang (its record `ready`) that nobody will watch, over connections of its own."""
    gang = open_gang(ready, factory, on_event)
    try:
        teardown(gang, recorder, ready, INTERRUPTED, status="stopped", release_owner=True)
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
    recorder = Recorder(store, name)
    dep = recorder.stop_asked()
    final_status: Status = "stopped" if dep.status in ACTIVE else dep.status
    owner = dep.owner
    if owner is not None and owner.alive() and not owner.terminate(dep.stop_grace_s + OWNER_EXIT_EXTRA_S):
        raise StateError(f"the {owner.role} process {owner.pid} of {name} did not exit")
    dep = recorder.record()  # the owner may have recorded new handles, or stopped the nodes, before it went
    started = [n for n in dep.nodes if n.handle is not None]
    outcome = {n.rank: "stopped" for n in started if n.phase == "stopped"}
    left = [n.rank for n in started if n.phase != "stopped"]
    if left:
        gang = open_gang(dep, factory, on_event, ranks=left)
        try:
            outcome |= teardown(gang, recorder, dep, None, status=final_status, release_owner=True)
        finally:
            gang.close()
    else:
        allocation_of(dep).release(None)  # idempotent: nodes the supervisor already gave back are fine
        if dep.status in ACTIVE:  # e.g. the owner was ended between a restart's stop and its next start
            recorder.stopped(None, final_status, {}, release_owner=True)
    return recorder.record(), outcome
