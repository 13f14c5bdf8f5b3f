"""Rollout of replicas against a fake router (tests/unit/fake_pd_router.py, answering as smg 1.13.0 was seen to)
and recorded replica stops and starts: each replica out of the router and back in turn, as a regular worker; a
rollout that completes clears the cause an earlier failed one left in the service record (else `status` would
call the service degraded for good)."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.launch.prepare import unit_of
from k3deploy.launch.rollout import InstanceOps, rollout
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.files import require_feasible
from k3deploy.records.service import ReplicaEntry, Service, ServiceStore
from k3deploy.records.store import StateStore
from tests.unit.fake_pd_router import FakeRouter, Worker, free_base, serving

pytestmark = pytest.mark.timeout(60)
LOCAL = Path(__file__).resolve().parents[2] / "tests" / "assets" / "replicas" / "local-2x2-smg.yaml"


def test_each_replica_out_and_back_in_turn_and_an_old_cause_cleared(tmp_path: Path) -> None:
    path = tmp_path / "replicas.yaml"
    path.write_text(LOCAL.read_text(encoding="utf-8").replace("port: 18000", f"port: {free_base()}"),
                    encoding="utf-8")
    cat = load_catalog()
    unit = unit_of(require_feasible(path, cat), ExecOverrides(), cat)
    assert unit.plan.router is not None
    urls = list(unit.plan.router.settings.worker_urls)
    router = FakeRouter(workers=[Worker(f"id{i}", u, "regular", None) for i, u in enumerate(urls)], prompts={})
    store = StateStore(tmp_path / "state")
    done: list[tuple[str, int]] = []
    ops = InstanceOps(stop=lambda i: done.append(("stop", i)), start=lambda i: done.append(("start", i)))
    with serving(router, urls) as url:
        ServiceStore(store).save(Service(
            name=unit.name, file=unit.plan.file, status="degraded", router_kind="smg", router_url=url,
            replicas=tuple(ReplicaEntry(index=i, name=p.name, url=urls[i], phase="ready",
                                        cause="rollout short: fail: an earlier version" if i == 0 else "")
                           for i, p in enumerate(unit.instances))))
        svc = rollout(unit, store, drain_s=10, ops=ops)
    assert done == [("stop", 0), ("start", 0), ("stop", 1), ("start", 1)]
    assert [(m, b) for m, _, b in router.calls] == [("DELETE", None), ("POST", {"url": urls[0]}),
                                                    ("DELETE", None), ("POST", {"url": urls[1]})]
    assert svc.status == "ready" and [(r.cause, r.phase) for r in svc.replicas] == [("", "ready"), ("", "ready")]
