"""`validate` and `rollout`'s short stage of 2 replicas x 2 hosts of the stand-in (SGLang mimic) behind the real
smg over SSH on the namespace rig, on one launch: validate passes clean, the node stages run per replica
(kernels[r0], kernels[r1]), every request stage names the replica that served it (smg's served-by header) and
the prefix-cache conversation stays on one replica; replica 1 restarted with the wrong MoE kernel fails exactly
kernels[r1]; a rollout whose new replica 0 answers tool calls unparsed stops at its `short` stage, naming it,
with replica 1 still serving; stop leaves nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.records.store import StateStore
from tests.integration.replica_faults import restart_replica, with_fault
from tests.integration.sim_deployments import Deployments, hosts_empty
from tests.integration.test_router_tables import needs_routers
from tests.integration.test_service_ssh import _complete, _router_gone, _service, _status
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, needs_routers]
NAME = "it-svc-val"
REPLICAS = (f"{NAME}-r0", f"{NAME}-r1")
REQUEST_STAGES = ("short", "vision", "long", "prefix-cache", "effort")


def _validate(topo: Path, *more: str) -> tuple[int, dict[str, dict]]:  # type: ignore[type-arg]
    run = cli("validate", str(topo), "--json", *more, timeout_s=600)
    report = json.loads(run.stdout)
    return run.returncode, {s["name"]: s for s in report["stages"]}


@pytest.mark.timeout(900)
def test_validate_and_rollout_short_of_two_replicas_behind_smg(deployments: Deployments, rig4: HostRig,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    topo, port = _service(deployments, NAME, "smg", "sglang")
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", timeout_s=400)
    assert run.returncode == 0, run.stderr

    code, stages = _validate(topo)
    assert code == 0, stages
    assert list(stages) == [f"{s}[r{i}]" for i in (0, 1) for s in ("shards", "kernels", "topology")] + [
        *REQUEST_STAGES, "accuracy"], list(stages)
    assert all(s["status"] in ("pass", "skip") for s in stages.values()), stages
    assert all(stages[f"{s}[r{i}]"]["status"] == "pass" for i in (0, 1) for s in ("kernels", "topology")), stages
    for name in REQUEST_STAGES:
        served = stages[name]["results"]["served_by"]
        assert stages[name]["status"] == "pass" and served and set(served) <= set(REPLICAS), stages[name]
        assert "served by" in stages[name]["detail"] and "x-smg-routed-worker-id" in stages[name]["evidence"]
    turns = stages["prefix-cache"]["results"]["served_by_turn"]
    assert len(turns) == 2 and turns[0] == turns[1] and len(turns[0]) == 1, turns
    assert stages["prefix-cache"]["results"]["cached_tokens"] > 0
    with capsys.disabled():
        print("\nvalidate through smg, served by: " + "; ".join(
            f"{n} {stages[n]['results']['served_by']}" for n in REQUEST_STAGES))

    # Replica 1 alone runs the wrong MoE kernel: its kernels stage fails, naming it; replica 0's and the
    # requests through the router pass.
    restart_replica(with_fault(topo, "wrong_kernel"), 1, store)
    assert wait_for(lambda: [r["router_healthy"] for r in _status(topo)["replicas"]] == [True, True], 60)
    code, stages = _validate(topo, "--only", "kernels,short")
    assert code == 1, stages
    assert {n: s["status"] for n, s in stages.items()} == {
        "kernels[r0]": "pass", "kernels[r1]": "fail", "short": "pass"}, stages

    # A rollout to a version whose tool calls come back unparsed: replica 0 answers completions (ready) but
    # fails `short` straight to it, so it is not put back; the rollout stops there and replica 1 serves.
    bad = cli("rollout", str(with_fault(topo, "no_tool_parser")), timeout_s=600)
    assert bad.returncode == 4, bad.stderr
    assert f"rollout stopped at {NAME}-r0, stage short" in bad.stderr, bad.stderr
    assert "tool_calls" in bad.stderr, bad.stderr
    st = _status(topo)
    assert st["status"] == "degraded" and "rollout short" in st["replicas"][0]["problem"], st
    assert st["replicas"][1]["problem"] == "" and st["replicas"][1]["router_healthy"] is True, st
    assert set(_complete(port, 4)) == {st["replicas"][1]["url"]}

    stop = cli("stop", str(topo), timeout_s=120)
    assert stop.returncode == 0, stop.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert wait_for(lambda: _router_gone(store, NAME), 20)
