"""The service record: one file per service (replicas behind a router) listing its replica deployments and its
router deployment; each of those is an ordinary deployment record. Atomic writes, 0600, under a lock."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Literal

from pydantic import Field

from k3deploy.errors import StateError
from k3deploy.records.record import Record
from k3deploy.records.status import Status
from k3deploy.records.store import StateStore

ReplicaPhase = Literal["starting", "ready", "failed", "stopped"]


class ReplicaEntry(Record):
    """One replica: its deployment record, its worker URL, and what launch saw of it."""

    index: int
    name: str = Field(description="its deployment record (NAME-rI)")
    url: str = Field(description="the worker URL the router is given")
    role: str = Field("", description="prefill | decode (an instance of a PD role); empty for a replica")
    phase: ReplicaPhase = "starting"
    tries: int = 0
    cause: str = Field("", description="why it is out of the router (a failed start, after every try)")
    served_through_router: bool = Field(False, description="a completion through the router was answered by it")


class Service(Record):
    """Replicas behind a router, as launched."""

    name: str
    file: str
    status: Status
    created_at: float = Field(default_factory=time.time)
    ready_at: float | None = None
    router_kind: str
    router_name: str | None = Field(None, description="the router's deployment record (NAME-router), once started")
    router_url: str
    replicas: tuple[ReplicaEntry, ...]
    cause: str = ""
    # Records written before the router's preflight existed load as "none".
    preflight: Literal["passed", "failed", "skipped", "none"] = Field(
        "none", description="the router's checks before any instance started: passed, failed, skipped "
        "(--skip-preflight); each instance's own preflight is in its deployment record")

    def with_replica(self, index: int, **changes: object) -> Service:
        """A copy with one replica's fields changed."""
        reps = tuple(r.model_copy(update=changes) if r.index == index else r for r in self.replicas)
        return self.model_copy(update={"replicas": reps})


class ServiceStore:
    """Service records in `services/` beside the deployment records (which hold the replicas and router)."""

    def __init__(self, store: StateStore) -> None:
        self.deployments = store
        self._dir = StateStore(store.directory / "services")  # its lock and directory handling, not its records

    def path(self, name: str) -> os.PathLike[str]:
        """The record file of a service."""
        return self._dir.path(name)

    def load(self, name: str) -> Service | None:
        """The service, or None when `name` is no service."""
        return self._dir.read(name, Service, "service")

    def save(self, svc: Service) -> None:
        """Write atomically: temp file in the same directory, fsync, rename; mode 0600."""
        self._dir.write(svc.name, svc)

    def update(self, name: str, change: Callable[[Service], Service]) -> Service:
        """Load, change and save under the service's lock (replica threads write concurrently)."""
        with self._dir.lock(name):
            svc = self.load(name)
            if svc is None:
                raise StateError(f"no service named {name} in {self._dir.directory}")
            new = change(svc)
            self.save(new)
            return new

    def lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The service's lock."""
        return self._dir.lock(name)
