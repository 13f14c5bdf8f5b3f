"""`k3deploy rollout` of prefill/decode roles over SSH on the namespace rig: 2 prefills + 2 decodes of the stand-in
(SGLang mimic, one host each) behind the real smg, and sglang-router, in PD mode. Under a steady client stream through the router the
rollout restarts every instance (prefills first), fails no request, and the router's /workers, polled every
0.5 s, never shows 0 healthy of a role; then a rollout whose new prefill cannot get ready stops there, naming it,
its role and the stage, and the rest keep serving; stop leaves nothing. (A role with a single instance, or
vllm-router, is refused before anything: tests/unit/test_pd_rollout.py.)"""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import yaml

from k3deploy.records.store import StateStore
from tests.integration.sim_deployments import Deployments
from tests.integration.test_pd_service_ssh import _answer, _chat, _pd_topology, _status, _stop_leaves_nothing
from tests.integration.test_router_tables import needs_routers
from tests.integration.test_service_ssh import Stream
from tests.integration.test_sim_pd import FACTS, QUESTION, RIGHT
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, needs_routers]
NAME = "it-pdroll"
INSTANCES = [f"{NAME}-prefill0", f"{NAME}-prefill1", f"{NAME}-decode0", f"{NAME}-decode1"]


class RoleStream(Stream):
    """Stream's steady client; its /workers poll counts the healthy workers of each role."""

    def __init__(self, port: int) -> None:
        self.fewest_by_role = {"prefill": 99, "decode": 99}
        self.polls = 0
        super().__init__(port)

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            workers = httpx.get(f"http://127.0.0.1:{self.port}/workers", timeout=5).json()["workers"]
            self.polls += 1
            for role in self.fewest_by_role:
                healthy = sum(1 for w in workers if w["worker_type"] == role and w["is_healthy"])
                self.fewest_by_role[role] = min(self.fewest_by_role[role], healthy)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("router", ["smg", "sglang-router"])
def test_rollout_of_two_prefills_two_decodes_over_ssh(deployments: Deployments, rig4: HostRig, router: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """smg lists a worker it drops `draining` until its requests end; sglang-router drops it at once, so the
    drain waits on the instance's own running and waiting gauges."""
    topo, port = _pd_topology(deployments, NAME, prefill=[[0], [1]], decode=[[2], [3]], tp=1)
    doc: dict[str, Any] = yaml.safe_load(topo.read_text())
    doc["router"]["kind"] = router
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=500)
    assert run.returncode == 0, run.stderr
    assert [r["role"] for r in json.loads(run.stdout)["replicas"]] == ["prefill", "prefill", "decode", "decode"]
    started = {n: store.require(n).attempts[-1].started_at for n in INSTANCES}

    stream = RoleStream(port)
    t0 = time.monotonic()
    try:
        roll = cli("rollout", str(topo), timeout_s=900)
    finally:
        took = time.monotonic() - t0
        stream.end()
    assert roll.returncode == 0, roll.stderr
    assert stream.failed == [] and stream.ok > 0, stream.failed[:5]
    assert stream.polls > 0 and min(stream.fewest_by_role.values()) >= 1, stream.fewest_by_role
    lines = roll.stderr.splitlines()
    order = [next(i for i, line in enumerate(lines) if line.startswith(f"{role} {n}: stopping"))
             for role, n in zip(("prefill", "prefill", "decode", "decode"), INSTANCES)]
    assert order == sorted(order), roll.stderr  # prefills first, each in turn
    assert all(store.require(n).attempts[-1].started_at > started[n] for n in INSTANCES)  # each restarted
    assert f"decode {NAME}-decode1: serving again" in roll.stderr, roll.stderr
    st = _status(topo)
    assert st["status"] == "ready" and [(r["role"], r["router_healthy"], r["problem"]) for r in st["replicas"]] == [
        ("prefill", True, ""), ("prefill", True, ""), ("decode", True, ""), ("decode", True, "")], st
    assert all(v in _answer(_chat(port, [{"role": "user", "content": f"{FACTS} {QUESTION}"}])) for v in RIGHT)
    with capsys.disabled():
        print(f"\nPD rollout over SSH (2P2D behind {router}): {took:.0f} s, {stream.ok} requests, 0 failed, fewest "
              f"healthy per role {stream.fewest_by_role} over {stream.polls} polls\n{roll.stderr}")

    # The new version cannot get ready: prefill0's start fails, the rollout stops there, the rest serve.
    doc = yaml.safe_load(topo.read_text())
    doc["engine"]["env"]["K3SIM_FAULT"] = "crash_after_load"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    bad = cli("rollout", str(topo), timeout_s=600)
    assert bad.returncode == 4, bad.stderr
    assert f"rollout stopped at {NAME}-prefill0 (prefill), stage start" in bad.stderr, bad.stderr
    st = _status(topo)
    assert st["status"] == "degraded" and "rollout start" in st["replicas"][0]["problem"], st
    assert [(r["problem"], r["router_healthy"]) for r in st["replicas"][1:]] == [("", True)] * 3, st
    assert all(v in _answer(_chat(port, [{"role": "user", "content": f"{FACTS} {QUESTION}"}])) for v in RIGHT)
    _stop_leaves_nothing(topo, rig4, store, NAME)
