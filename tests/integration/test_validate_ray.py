"""`k3deploy validate` through Ray (one Ray node per namespace host, the agent actor runs the probe on its
node), each host with its own checkpoint copy at the same path: clean passes, every seeded fault is caught on
its host with the file named, one failing JUnit testcase per fault."""
from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from tests.integration.validate_rig import ROUNDS, RigNodes, check_clean, check_round
from tests.k3deploy_cli import run_k3deploy as run_cli
from tests.rig.ray_cluster import RAY_ENV, RayRig

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout_s=120, env={**os.environ, **RAY_ENV})


def ray_launch(cluster: RayRig) -> dict[str, Any]:
    return {"executor": "ray", "ray_address": cluster.address}


@pytest.mark.timeout(240)
def test_a_clean_checkpoint_passes_through_ray(nodes: RigNodes, ray4: RayRig) -> None:
    check_clean(nodes, ray_launch(ray4), cli)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("round_name", sorted(ROUNDS))
def test_each_fault_is_caught_through_ray(nodes: RigNodes, ray4: RayRig, round_name: str) -> None:
    check_round(nodes, round_name, ray_launch(ray4), cli)
