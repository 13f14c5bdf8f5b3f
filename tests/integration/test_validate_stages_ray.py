"""Stages kernels, topology and short through Ray (one Ray node per namespace host; logs read and, when rank 0
cannot be reached from here, requests made by the agent actors): a clean simulated-H100 deployment passes, and
a topology mismatch fails exactly `topology`."""
from __future__ import annotations

import pytest

from tests.integration.test_launch_ray import RayDeployments, checkpoint, cli, deployments, ray4
from tests.integration.test_validate_stages_ssh import MINE, STAGES, hopper, validated

pytestmark = pytest.mark.integration
__all__ = ["checkpoint", "deployments", "ray4"]  # the fixtures, imported


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("fault", "failing"), [(None, None), ("wrong_topology", "topology")])
def test_stages_through_ray(deployments: RayDeployments, fault: str | None, failing: str | None) -> None:
    topo = hopper(deployments, f"vr-{fault or 'clean'}".replace("_", "-"), fault)
    assert cli("launch", str(topo), "--skip-preflight").returncode == 0
    run = cli("validate", str(topo), "--only", MINE, "--json")
    assert run.returncode == (1 if failing else 0), run.stdout + run.stderr
    got = validated(run)
    assert {s: got[s]["status"] for s in STAGES} == {s: "fail" if s == failing else "pass" for s in STAGES}
    assert "Kimi-K3 on SM90: moe_runner_backend=marlin" in got["kernels"]["evidence"]
    if failing:
        assert "ep: the engine reports 1, the plan says 4" in got["topology"]["evidence"]
    assert cli("stop", str(topo)).returncode == 0
