"""`k3deploy weights status` and `weights sync` with launch.executor ray on the real Ray cluster of four
network-namespace hosts: the probes run as pinned tasks, each node's checkpoint server as a detached process of an
agent actor on its node, the pulls node to node over HTTP between the hosts' private addresses (Ray carries none
of it), each host with its own disk at the checkpoint path (tests/integration/weights_rig.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.sim_deployments import RAY_CLI_ENV, RayDeployments
from tests.integration.weights_rig import own_disks, status_sync_status
from tests.rig import HostRig
from tests.rig.ray_cluster import RayRig

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]


# The bound covers the run's Ray cluster start when this is the first test to use it (~25-50 s on 2 cores).
@pytest.mark.timeout(180)
def test_status_then_sync_then_status_through_ray(rig4: HostRig, ray4: RayRig, tmp_path: Path) -> None:
    with own_disks(rig4, tmp_path) as d:
        deployments = RayDeployments(rig4, ray4, Path(d.at), tmp_path)  # model.path: each host's own disk
        status_sync_status(d, deployments.topology("w-ray"), [h.mgmt_ip for h in rig4.hosts], RAY_CLI_ENV)
    # No checkpoint server, watchdog or agent actor left on a host (Ray's own processes stay).
    assert deployments.cleanup() == []
