"""`k3deploy validate` (all seven stages) through Ray, one Ray node per namespace host, as simulated H100s: a
clean SGLang-mimicking deployment passes every stage asked from here; with rank 0 asked on its node
(readiness_probe: head, as from a login node) every request and the load run on rank 0, and a vLLM-mimicking
cache that restores the wrong state fails prefix-cache alone (its cold request cache-salted on the node).

Only the faults whose evidence takes a Ray-specific path run here (requests and the load from rank 0's node).
A wrong topology fails the topology stage from logs and /server_info alike on every executor: it is tested on both
dialects in tests/unit/test_validate_live_stages.py, and this module's runs still pass the topology stage through
Ray (the clean run from here, the cache fault from the node)."""
from __future__ import annotations

import pytest

from tests.integration.sim_deployments import RayDeployments, nothing_left
from tests.integration.test_launch_ray import cli
from tests.integration.validate_all import fault_id, launch_validate_stop, topology
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("fault", "mimic", "probe"), [
    ("", "sglang", "auto"), ("wrong_cache_state", "vllm", "head")])
def test_every_stage_through_ray(deployments: RayDeployments, rig4: HostRig, fault: str, mimic: str,
                                 probe: str) -> None:
    name = f"var-{fault_id(fault)}".replace("_", "-")
    topo = topology(deployments, name, fault, mimic, launch={"readiness_probe": probe})
    stages = launch_validate_stop(cli, topo, fault, mimic)
    assert nothing_left(rig4)
    assert [n["status"] for n in stages["shards"]["nodes"]] == ["pass"] * 4
    effort = stages["effort"]
    assert effort["results"]["route"] == ("on-node" if probe == "head" else "here"), effort["detail"]
    assert effort["results"]["cold"]["completed"] == 8
    if probe == "head":
        assert "load ran on the node (rank 0), by one python3 process there" in effort["detail"]
    assert "world_size=4, nnodes=4, tp=4, ep=4, dp=1, pp=1, experts_per_rank=8" in stages["topology"]["detail"]
