"""The service record is written and read by the deployment store's own writer: private, atomic, under the
service's lock, with errors that say which file and what kind of record."""
from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from k3deploy.errors import StateError
from k3deploy.records.service import ReplicaEntry, Service, ServiceStore
from k3deploy.records.service_recorder import ServiceRecorder
from k3deploy.records.store import StateStore
from tests.unit.test_state import record

pytestmark = pytest.mark.timeout(60)


def service(name: str = "svc", replicas: int = 2) -> Service:
    return Service(name=name, file="/t.yaml", status="starting", router_kind="smg", router_url="http://h:8080",
                   replicas=tuple(ReplicaEntry(index=i, name=f"{name}-r{i}", url=f"http://h:{8000 + i}")
                                  for i in range(replicas)))


def test_save_is_private_atomic_beside_the_deployments_and_round_trips(tmp_path: Path) -> None:
    deployments = StateStore(tmp_path / "state")
    store = ServiceStore(deployments)
    svc = service()
    store.save(svc)
    path = Path(store.path("svc"))
    assert path == deployments.directory / "services" / "svc.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.load("svc") == svc
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert deployments.load("svc") is None  # a service is not a deployment record


def test_concurrent_replica_updates_lose_nothing(tmp_path: Path) -> None:
    store = ServiceStore(StateStore(tmp_path))
    store.save(service(replicas=8))

    def mark(i: int) -> None:
        store.update("svc", lambda s: s.with_replica(i, phase="ready", tries=1))

    threads = [threading.Thread(target=mark, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [(r.phase, r.tries) for r in store.load("svc").replicas] == [("ready", 1)] * 8  # type: ignore[union-attr]


def test_missing_corrupt_and_unwritable_records_are_state_errors(tmp_path: Path) -> None:
    store = ServiceStore(StateStore(tmp_path))
    assert store.load("svc") is None
    with pytest.raises(StateError, match="no service named svc"):
        store.update("svc", lambda s: s)
    store.save(service())
    Path(store.path("svc")).write_text("{not json")
    with pytest.raises(StateError, match=r"services/svc\.json is not a k3deploy service record") as err:
        store.load("svc")
    assert err.value.exit_code == 5
    Path(store.path("svc")).unlink()
    Path(store.path("svc")).mkdir()  # the rename onto it fails, even for root
    with pytest.raises(StateError, match=r"cannot write .*services/svc\.json"):
        store.save(service())
    assert [p.name for p in (tmp_path / "services").iterdir() if p.name.endswith(".tmp")] == []


def test_the_recorder_writes_each_phase_of_a_service_and_refuses_an_active_one(tmp_path: Path) -> None:
    deployments = StateStore(tmp_path)
    rec = ServiceRecorder(deployments, "svc")
    rec.created(service(replicas=3))
    with pytest.raises(StateError, match="service svc is already starting"):
        rec.created(service(replicas=3))
    rec.checked("passed")
    rec.instance_ready(0)
    rec.instance_failed(1, "gang failed")
    rec.instance_ready(2)
    rec.fronting("svc-router")
    got = rec.registered([0, 2], [True, False], 12.5)
    assert (got.status, got.preflight, got.router_name, got.ready_at) == ("degraded", "passed", "svc-router", 12.5)
    assert [(r.phase, r.cause, r.served_through_router) for r in got.replicas] == [
        ("ready", "", True), ("failed", "gang failed", False), ("ready", "", False)]
    assert ServiceStore(deployments).load("svc") == got
    assert rec.stopping().status == "stopping"
    done = rec.stopped("failed", "router did not serve")
    assert (done.status, done.cause) == ("failed", "router did not serve")
    assert [r.phase for r in done.replicas] == ["stopped", "failed", "stopped"]
    assert rec.stopped("stopped", "").cause == "router did not serve"  # a later stop keeps why it failed


def test_the_recorder_refuses_a_service_whose_instance_is_still_active(tmp_path: Path) -> None:
    deployments = StateStore(tmp_path)
    deployments.save(record("svc-r1"))
    with pytest.raises(StateError, match="replica svc-r1 of svc is already starting") as err:
        ServiceRecorder(deployments, "svc").created(service())
    assert err.value.hint == "stop it first: k3deploy stop svc-r1"
    assert ServiceStore(deployments).load("svc") is None
