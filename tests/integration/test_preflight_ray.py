"""`k3deploy preflight --executor ray` on a real Ray cluster over four network-namespace hosts: every
probe runs on its node through Ray; a clean cluster passes (Ray and Python versions compared), and another
engine release on one node (a bind mount in that host's mount namespace, which its raylet shares) is named.
A service of two replicas (two hosts each, the router on the first host) is checked through Ray too."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from k3deploy.engines.flag_tables import DATA_DIR, TABLE_FILES
from tests.integration.sim_deployments import RAY_CLI_ENV, RayDeployments
from tests.integration.test_preflight_service_ssh import _service as service_topology
from tests.integration.test_preflight_ssh import failed, mounted, stages
from tests.integration.test_router_tables import needs_routers
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig
from tests.rig.ray_cluster import RayRig

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]


def preflight(topo: Path, capsys: pytest.CaptureFixture[str], what: str,
              timeout_s: float = 120) -> tuple[int, dict[str, Any]]:
    t0 = time.monotonic()
    run = cli("preflight", str(topo), "--json", env=RAY_CLI_ENV, timeout_s=timeout_s)
    took = time.monotonic() - t0
    assert run.stdout.strip(), run.stderr
    report = json.loads(run.stdout)
    parts = report["instances"] or [report]  # a service: each instance's own report
    with capsys.disabled():
        print(f"\npreflight through Ray, {what}: exit {run.returncode} in {took:.1f} s "
              f"({'; '.join(stages(p) for p in parts)})")
    return run.returncode, report


@pytest.mark.timeout(180)
def test_preflight_through_ray(rig4: HostRig, ray4: RayRig, checkpoint: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    deployments = RayDeployments(rig4, ray4, checkpoint, tmp_path)
    topo = deployments.topology("pf-ray")
    code, report = preflight(topo, capsys, "clean cluster")
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert code == 0, json.dumps([c for c in report["checks"] if c["status"] != "pass"], indent=1)
    assert statuses["ray"] == "pass" and statuses["rendezvous"] == "pass" and statuses["port"] == "pass"
    ray_check = next(c for c in report["checks"] if c["name"] == "ray")
    assert all("Ray 2." in v["detail"] for v in ray_check["verdicts"]), ray_check

    table = DATA_DIR / TABLE_FILES["sglang"]
    other = tmp_path / table.name
    data = json.loads(table.read_text())
    data["engine"] = "sglang 0.5.22"
    other.write_text(json.dumps(data))
    with mounted(rig4, "h03", other, str(table)):
        code, report = preflight(topo, capsys, "sglang 0.5.22 on h03")
    assert code == 1
    bad = failed(report, "engine")
    assert [v["rank"] for v in bad] == [2] and "engine version 0.5.22; expected 0.5.23" in bad[0]["detail"], bad
    assert deployments.cleanup() == []


def _statuses(part: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in part["checks"]}


@needs_routers
@pytest.mark.timeout(400)
def test_preflight_of_a_service_through_ray(rig4: HostRig, ray4: RayRig, checkpoint: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Two replicas x two hosts through Ray: every instance's checks and the router's (port and interpreter on
    the router's host, asked through Ray) pass; a wrong interface on replica 1's second node fails naming that
    replica, rank and host alone, replica 0's checks all there and passing, the router's still passing."""
    deployments = RayDeployments(rig4, ray4, checkpoint, tmp_path)
    code, report = preflight(service_topology(deployments, rig4, "pfs-ray"), capsys, "service, 2 replicas x 2 "
                             "hosts", timeout_s=300)
    assert code == 0, json.dumps(report, indent=1)
    assert [i["instance"] for i in report["instances"]] == ["replica 0", "replica 1"]
    for i, part in enumerate(report["instances"]):
        st = _statuses(part)
        assert st["ray"] == "pass" and st["rendezvous"] == "pass" and st["port"] == "pass", st
        hosts = {v["host"] for c in part["checks"] for v in c["verdicts"]}
        assert hosts == {rig4.hosts[2 * i].mgmt_ip, rig4.hosts[2 * i + 1].mgmt_ip}, hosts
    assert _statuses(report) == {"router-port": "pass", "router-python": "pass"}, report["checks"]
    assert {v["host"] for c in report["checks"] for v in c["verdicts"]} == {rig4.hosts[0].mgmt_ip}

    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    nodes[3]["iface"] = "ens-bogus"  # replica 1's rank 1
    code, report = preflight(service_topology(deployments, rig4, "pfs-ray-iface", nodes), capsys,
                             "service, ens-bogus on replica 1's second node", timeout_s=300)
    assert code == 1, json.dumps(report, indent=1)
    bad = [(p["instance"], c["name"], v["rank"], v["host"]) for p in (*report["instances"], report)
           for c in p["checks"] for v in c["verdicts"] if v["status"] == "fail"]
    assert bad == [("replica 1", "iface", 1, rig4.hosts[3].mgmt_ip)], bad
    r0, r1 = report["instances"]
    assert set(_statuses(r0).values()) <= {"pass", "skip"} and _statuses(r0)["rendezvous"] == "pass", _statuses(r0)
    assert all(len(c["verdicts"]) == 2 for c in r0["checks"])
    assert _statuses(r1)["rendezvous"] == "skip" and (r0["exit_code"], r1["exit_code"]) == (0, 1)
    assert "ens-bogus" in next(v["detail"] for c in r1["checks"] for v in c["verdicts"] if v["status"] == "fail")
    assert _statuses(report) == {"router-port": "pass", "router-python": "pass"}
    assert deployments.cleanup() == []
