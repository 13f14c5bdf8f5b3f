"""`k3deploy preflight --executor ray` on a real Ray cluster over four network-namespace hosts: every
probe runs on its node through Ray; a clean cluster passes (Ray and Python versions compared), and another
engine release on one node (a bind mount in that host's mount namespace, which its raylet shares) is named."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from k3deploy.engines.flag_tables import DATA_DIR, TABLE_FILES
from tests.integration.test_launch_ray import RAY_CLI_ENV, RayDeployments, ray4
from tests.integration.test_preflight_ssh import failed, mounted, stages
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig
from tests.rig.ray_cluster import RayRig

pytestmark = pytest.mark.integration


__all__ = ["ray4"]  # the module-scoped fixture, shared with the Ray launch tests


def preflight(topo: Path, capsys: pytest.CaptureFixture[str], what: str) -> tuple[int, dict[str, Any]]:
    t0 = time.monotonic()
    run = cli("preflight", str(topo), "--json", env=RAY_CLI_ENV)
    took = time.monotonic() - t0
    assert run.stdout.strip(), run.stderr
    report = json.loads(run.stdout)
    with capsys.disabled():
        print(f"\npreflight through Ray, {what}: exit {run.returncode} in {took:.1f} s ({stages(report)})")
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
