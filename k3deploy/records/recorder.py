"""The one writer of a deployment's record while it lives: created, placed, the preflight verdict, each node's
handle as it starts, ready, stopped (the failure, each node's outcome, the nodes' logs kept, the owner let go),
owned by whoever watches it. Bring-up, the supervisor and stop tell it what happened; each write is one locked,
atomic write (records/store.py). A scheduler's allocation writes its own job into the record through the store."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

from k3deploy.errors import StateError
from k3deploy.executors.base import ProcessHandle
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Attempt, Deployment, Failure
from k3deploy.records.owner import Identity, start_ticks
from k3deploy.records.status import ACTIVE, Status
from k3deploy.records.store import StateStore

Verdict = Literal["passed", "failed"]


class Recorder:
    """Every write of one deployment's record, one method for each thing that happened to it."""

    def __init__(self, store: StateStore, name: str) -> None:
        self.store = store
        self.name = name
        # Handles that arrive while a write is under way wait here for the next write (one write per wave).
        self._pending: dict[int, ProcessHandle] = {}
        self._writing = threading.Lock()  # held across a write: a start returns only once its handle is on disk
        self._taken = threading.Lock()

    def record(self) -> Deployment:
        """The record as it is on disk."""
        return self.store.require(self.name)

    def created(self, dep: Deployment) -> None:
        """Write a fresh record; StateError when a deployment of that name is still active."""
        with self.store.lock(self.name):
            old = self.store.load(self.name)
            if old is not None and old.status in ACTIVE:
                raise StateError(f"deployment {self.name} is already {old.status} (record {self.store.path(self.name)})",
                                 hint=f"stop it first: k3deploy stop {self.name}")
            self.store.save(dep)

    def placed(self, probe_from: Literal["here", "head"]) -> Deployment:
        """Where readiness is asked from, once the nodes are placed; returns the record bring-up begins with."""
        return self.store.update(self.name, lambda d: d.model_copy(update={"probe_from": probe_from}))

    def checked(self, verdict: Verdict) -> None:
        """The verdict of the preflight before the first start."""
        self.store.update(self.name, lambda d: d.model_copy(update={"preflight": verdict}))

    def started(self, job: NodeJob, handle: ProcessHandle) -> None:
        """Write a node's handle before its start returns (a crash never orphans it). Handles that arrive while
        a write is under way go into the next write together: one write per wave of starts, not one locked,
        fsynced write per node after another."""
        with self._taken:
            self._pending[job.rank] = handle
        with self._writing:
            with self._taken:
                batch = dict(self._pending)
                self._pending.clear()
            if batch:
                self.store.update(self.name, lambda d: _with_started(d, batch))

    def ready(self) -> Deployment:
        """Every node ready, and the attempt with it."""
        now = time.time()

        def ready(d: Deployment) -> Deployment:
            nodes = tuple(n.model_copy(update={"phase": "ready"}) for n in d.nodes)
            last = d.attempts[-1].model_copy(update={"ready_at": now})
            return d.model_copy(update={"status": "ready", "ready_at": now, "nodes": nodes,
                                        "attempts": (*d.attempts[:-1], last)})

        return self.store.update(self.name, ready)

    def stopped(self, failure: Failure | None, status: Status, outcome: Mapping[int, str],
                logs: Mapping[int, str] = {}, *, release_owner: bool) -> Deployment:
        """Keep each node's log end (`logs` once the nodes are gone), then one write: the last attempt closed,
        each node's outcome, the status, the failure (and the owner let go, when nobody will act on it any more)."""
        try:
            self._keep_logs(logs)
        except OSError as exc:  # a full or read-only state disk must not hide why the gang was stopped
            print(f"k3deploy: cannot keep local copies of the node logs: {exc}", file=sys.stderr)

        def record(d: Deployment) -> Deployment:
            d = d.end_attempt(failure.cause if failure else "stopped")
            for rank, what in outcome.items():
                d = d.with_node(rank, phase="stopped" if what == "stopped" else "unknown")
            update: dict[str, object] = {"status": status}
            if release_owner:
                update["owner"] = None
            if failure is not None:
                update["failure"] = failure
            return d.model_copy(update=update)

        return self.store.update(self.name, record)

    def _keep_logs(self, logs: Mapping[int, str]) -> None:
        dest = self.store.logs_dir(self.name)
        for folder in (dest.parent, dest):  # mkdir(parents=True) would make the parent 0755
            folder.mkdir(mode=0o700, exist_ok=True)
        for rank, text in logs.items():
            if text:  # a node whose log is gone keeps its earlier copy; logs are private like the record
                fd = os.open(dest / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)

    def restarting(self) -> Deployment:
        """A new attempt begins: every node pending again, without a handle."""
        def next_attempt(d: Deployment) -> Deployment:
            attempt = Attempt(number=len(d.attempts) + 1, started_at=time.time())
            nodes = tuple(n.model_copy(update={"handle": None, "phase": "pending"}) for n in d.nodes)
            return d.model_copy(update={"attempts": (*d.attempts, attempt), "nodes": nodes, "status": "restarting"})

        return self.store.update(self.name, next_attempt)

    def stop_asked(self) -> Deployment:
        """An active deployment is `stopping` from now on (its owner stops the nodes it can reach); returns the
        record as it was."""
        with self.store.lock(self.name):
            dep = self.store.require(self.name)
            if dep.status in ACTIVE:
                self.store.save(dep.model_copy(update={"status": "stopping"}))
        return dep

    def owned_by(self, owner: Identity | None, failure: Failure | None = None) -> Deployment:
        """A new owner (None: nobody), with the failure that made the last one let go, if any."""
        update: dict[str, object] = {"owner": owner}
        if failure is not None:
            update["failure"] = failure
        return self.store.update(self.name, lambda d: d.model_copy(update=update))

    def handed_to(self, spawn: Callable[[], subprocess.Popen[bytes]]) -> Deployment:
        """Spawn the process that owns the deployment from now on and record it as owner under the record's lock
        (nobody acts on the record between the two); the process is ended again if that does not complete."""
        proc: subprocess.Popen[bytes] | None = None
        try:
            with self.store.lock(self.name):
                proc = spawn()
                dep = self.store.require(self.name).model_copy(update={"owner": Identity(
                    pid=proc.pid, start_ticks=start_ticks(proc.pid), role="supervisor")})
                self.store.save(dep)
            return dep
        except BaseException:
            if proc is not None:
                proc.kill()
                proc.wait()
            raise

def _with_started(d: Deployment, batch: Mapping[int, ProcessHandle]) -> Deployment:
    for rank, handle in batch.items():
        d = d.with_node(rank, handle=handle, phase="started")
    return d
