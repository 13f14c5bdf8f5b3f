"""`k3deploy weights status` and `weights sync` with launch.executor slurm on the Slurm rig: the nodes are reached
as steps of a job held for the command (the allocation seam preflight uses: submitted, placed, cancelled on the
way out), each host with its own disk at the checkpoint path, the source h01's own directory (`--from h01:DIR`),
every file pulled node to node over HTTP between the hosts' private addresses (tests/integration/weights_rig.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.test_sbatch_export_slurm import slurm_topology
from tests.integration.weights_rig import own_disks, status_sync_status
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.slurm_cluster import SlurmRig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slurm_cluster,
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="slurm-wlm is not installed "
                       "(scripts/test.sh installs slurmctld slurmd slurm-client munge)"),
]


def started(rig: HostRig) -> dict[str, list[str]]:
    """Processes a weights command started on each host (its checkpoint servers, its probes)."""
    out = {}
    for h in rig.hosts:
        ps = rig.exec(h, ["ps", "-ww", "-eo", "args="]).stdout.splitlines()
        out[h.name] = [line for line in ps if '"op": ' in line]
    return out


@pytest.mark.timeout(120)
def test_status_then_sync_then_status_through_a_held_job(slurm: SlurmRig, rig4: HostRig, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    with own_disks(rig4, tmp_path) as d:
        topo = slurm_topology(rig4, Path(d.at), tmp_path, "w-slurm")
        status_sync_status(d, topo, [h.name for h in rig4.hosts], {"SLURM_CONF": str(slurm.conf_path)})
    # Each command's job was cancelled on its way out, and nothing it started is left on a node.
    assert wait_for(lambda: not slurm.client(["squeue", "-h", "-o", "%i"]).stdout.strip(), 60), \
        slurm.client(["squeue", "-h", "-o", "%i %T %j"]).stdout
    assert wait_for(lambda: not any(started(rig4).values()), 30), started(rig4)
