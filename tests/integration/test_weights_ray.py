"""`k3deploy weights status` and `weights sync` with launch.executor ray on the real Ray cluster of four
network-namespace hosts: the probes run as pinned tasks, each node's checkpoint server as a detached process of an
agent actor on its node, the pulls node to node over HTTP between the hosts' private addresses (Ray carries none
of it), each host with its own disk at the checkpoint path (tests/integration/weights_rig.py).
A host lost mid-sync (every process of it killed, its raylet among them) is named while the others finish; once
its Ray node is back, a rerun completes it, sending only what it lacks."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from k3deploy.checkpoint.manifest import Manifest
from tests import figures
from tests.integration.sim_deployments import RAY_CLI_ENV, RayDeployments
from tests.integration.weights_rig import FILES, mid_sync, own_disks, slowed, status_sync_status, weights
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
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


RATE = 300_000  # bytes/s on every private link while a host is lost: a file (300 KB) takes ~1 s a hop


@pytest.mark.timeout(240)
def test_a_host_lost_mid_sync_is_named_the_others_finish_and_a_rerun_completes_it(
        rig4: HostRig, ray4: RayRig, tmp_path: Path) -> None:
    h03 = rig4.hosts[2]
    with own_disks(rig4, tmp_path) as d, ThreadPoolExecutor(1) as pool:
        deployments = RayDeployments(rig4, ray4, Path(d.at), tmp_path)
        topo = deployments.topology("w-ray-lost")
        source = f"{rig4.hosts[0].mgmt_ip}:{d.src}"
        back = None
        with slowed(rig4, RATE) as lift:
            proc = start_k3deploy("weights", "sync", topo, "--from", source, "--manifest", d.manifest, "--json",
                                  env=RAY_CLI_ENV)
            try:
                lost = wait_for(lambda: mid_sync(rig4, d, 2), 120)
                if lost:  # h03 crashes: its raylet, workers, copy and server at once
                    rig4.kill_host_processes(h03)
                    figures.fault_injected()
                    lift()  # the rest at full speed
                    # Its Ray node starts again (a new node, same IP) while the sync waits for Ray to call the old
                    # one dead (GCS health checks, ~15 s).
                    back = pool.submit(ray4.rejoin, h03)
            finally:
                out, err = proc.communicate(timeout=180)
        if back is not None:
            back.result()
        assert lost, err
        assert proc.returncode == 3 and "Traceback" not in err, err
        nodes = json.loads(out)["nodes"]  # stdout holds the report alone: none of Ray's messages about the node
        # Named, with Ray's word for what happened to it: "dead" once its GCS has called the node dead, "not
        # schedulable" (no such node) before; and how far its sync got.
        lost = nodes[2]["error"] or ""
        assert lost.startswith(f"{h03.mgmt_ip}: ") and (" dead" in lost or "not schedulable" in lost), nodes[2]
        assert lost.endswith(" files to go)"), nodes[2]
        assert [n["error"] for i, n in enumerate(nodes) if i != 2] == [None] * 3, nodes
        want = {n: f.sha256 for n, f in Manifest.load(d.manifest).files.items()}
        held = [d.finals(i) for i in range(4)]
        assert held[0] == held[1] == held[3] == want, held  # h04 finished, pulling past h03
        assert len(held[2]) < len(FILES) and all(want[n] == sha for n, sha in held[2].items()), held[2]

        rc, again, err = weights(RAY_CLI_ENV, "sync", topo, "--from", source, "--manifest", d.manifest)
        assert rc == 0, err
        assert [n["sent"] for n in again["nodes"]] == [0, 0, len(FILES) - len(held[2]), 0], again
        assert [d.finals(i) for i in range(4)] == [want] * 4
    assert deployments.cleanup() == []
