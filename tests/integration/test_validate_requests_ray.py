"""Stages long, prefix-cache and effort through Ray with rank 0 asked on its node (readiness_probe: head, as
from a login node): every request is made on rank 0, the load too, and the report says so; a cache that
restores the wrong state still fails prefix-cache alone."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sim_deployments import SimDeployments, write_tiny_checkpoint
from tests.integration.sim_deployments import cli as run_cli
from tests.integration.test_validate_requests_ssh import STAGES, small
from tests.rig import HostRig
from tests.rig.ray_cluster import RAY_ENV, RayRig

pytestmark = pytest.mark.integration
RAY_CLI_ENV = {**os.environ, **RAY_ENV}


@pytest.fixture(scope="module")
def ray4(rig4: HostRig) -> Iterator[RayRig]:
    with RayRig(rig4) as cluster:
        yield cluster


@pytest.fixture
def deployments(rig4: HostRig, ray4: RayRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimDeployments]:
    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))
    d = SimDeployments(rig4, ckpt, tmp_path_factory.mktemp("ray"), {"executor": "ray", "ray_address": ray4.address,
                                                                      "readiness_probe": "head"}, env=RAY_CLI_ENV)
    yield d
    assert d.stop_leftovers() == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", ["", "wrong_cache_state"])
def test_request_stages_run_on_rank_0_through_ray(deployments: SimDeployments, fault: str) -> None:
    name = "vqr-" + (fault.replace("_", "-") or "clean")
    topo: Path = small(deployments.topology(name, env={"K3SIM_SPEED": "8", **({"K3SIM_FAULT": fault} if fault else {})}))
    launched = run_cli("launch", str(topo), env=RAY_CLI_ENV)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    try:
        done = run_cli("validate", str(topo), "--only", ",".join(STAGES), "--json", timeout_s=240, env=RAY_CLI_ENV)
    finally:
        run_cli("stop", str(topo), env=RAY_CLI_ENV)
    report = json.loads(done.stdout)
    stages = {s["name"]: s for s in report["stages"]}
    want = {"long": "pass", "prefix-cache": "fail" if fault else "pass", "effort": "pass"}
    assert {n: s["status"] for n, s in stages.items()} == want, {n: s["detail"] for n, s in stages.items()}
    assert stages["effort"]["results"]["route"] == "on-node"
    assert "load ran on the node (rank 0), by one python3 process there" in stages["effort"]["detail"]
    assert stages["effort"]["results"]["cold"]["completed"] == 8
    if fault:
        assert "a cache hit changed the answer" in stages["prefix-cache"]["detail"]
