"""The one writer of a service's record while it launches and stops: created with its instances, the router's
preflight verdict, each instance's outcome, the router started (fronting), registered, stopping and stopped.
Launch and stop tell it what happened; each write is one load-change-save under the service's lock
(records/service.py), as instance threads report concurrently."""
from __future__ import annotations

from collections.abc import Sequence

from k3deploy.errors import StateError
from k3deploy.records.recorder import Verdict
from k3deploy.records.service import Service, ServiceStore
from k3deploy.records.status import ACTIVE
from k3deploy.records.store import StateStore


class ServiceRecorder:
    """Every write of one service's record, one method for each thing that happened to it."""

    def __init__(self, store: StateStore, name: str) -> None:
        self.services = ServiceStore(store)
        self.name = name

    def created(self, svc: Service) -> None:
        """Write a fresh record; StateError when the service, or a deployment of one of its instances, is
        still active."""
        with self.services.lock(self.name):
            old = self.services.load(self.name)
            if old is not None and old.status in ACTIVE:
                raise StateError(f"service {self.name} is already {old.status}",
                                 hint=f"stop it first: k3deploy stop {self.name}")
            for rep in svc.replicas:
                dep = self.services.deployments.load(rep.name)
                if dep is not None and dep.status in ACTIVE:
                    raise StateError(f"replica {dep.name} of {self.name} is already {dep.status}",
                                     hint=f"stop it first: k3deploy stop {dep.name}")
            self.services.save(svc)

    def checked(self, verdict: Verdict) -> None:
        """The router's preflight verdict, before any instance started."""
        self.services.update(self.name, lambda s: s.model_copy(update={"preflight": verdict}))

    def instance_ready(self, index: int) -> None:
        """An instance became ready."""
        self.services.update(self.name, lambda s: s.with_replica(index, phase="ready", cause=""))

    def instance_failed(self, index: int, cause: str) -> None:
        """An instance failed to start after every try: named, and left out of the router."""
        self.services.update(self.name, lambda s: s.with_replica(index, phase="failed", cause=cause))

    def fronting(self, router: str) -> None:
        """The router's deployment record, as it starts."""
        self.services.update(self.name, lambda s: s.model_copy(update={"router_name": router}))

    def registered(self, ready: Sequence[int], served: Sequence[bool], at: float) -> Service:
        """The router serves the ready instances (`served`: each one seen answering through it): ready when
        every instance is, degraded otherwise."""
        def done(s: Service) -> Service:
            for i, through in zip(ready, served, strict=True):
                s = s.with_replica(i, served_through_router=through)
            status = "ready" if len(ready) == len(s.replicas) else "degraded"
            return s.model_copy(update={"status": status, "ready_at": at})

        return self.services.update(self.name, done)

    def stopping(self) -> Service:
        """Stop began: `stopping` until it ends, so a crash midway leaves a record `stop` finishes."""
        return self.services.update(self.name, lambda s: s.model_copy(update={"status": "stopping"}))

    def stopped(self, status: str, cause: str) -> Service:
        """Stop ended: failed (a failed launch) or stopped, and every instance not failed stopped."""
        final = "failed" if status == "failed" else "stopped"
        return self.services.update(self.name, lambda s: s.model_copy(update={
            "status": final, "cause": cause or s.cause,
            "replicas": tuple(r.model_copy(update={"phase": "failed" if r.phase == "failed" else "stopped"})
                              for r in s.replicas)}))
