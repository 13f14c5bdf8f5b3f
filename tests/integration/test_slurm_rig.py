"""The Slurm rig itself: a real slurmctld and one slurmd per namespace host, ranks from SLURM_NODEID."""

from __future__ import annotations

import shutil

import pytest

from tests.rig import HostRig, procs
from tests.rig.slurm_cluster import SlurmRig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="slurm-wlm is not installed "
                       "(scripts/test.sh installs slurmctld slurmd slurm-client munge)"),
]


def _slurm_pids(rig: HostRig) -> list[int]:
    """Slurm or munge daemons (and job steps) of this rig: named by its files, or inside its hosts."""
    in_hosts = {p for h in rig.hosts for p in rig.pids(h, root_ns=True)}
    found = []
    for pid in procs.all_pids():
        if (procs.exe_path(pid) or "").rsplit("/", 1)[-1] not in {"slurmctld", "slurmd", "slurmstepd", "munged"}:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
        except OSError:
            continue
        if str(rig.workdir) in cmd or pid in in_hosts:
            found.append(pid)
    return found


def test_four_nodes_idle_run_one_task_each_by_node_id_and_leave_nothing(make_rig) -> None:
    rig = make_rig(4)
    with SlurmRig(rig) as slurm:
        assert slurm.node_states() == {h.name: "idle" for h in rig.hosts}
        run = slurm.client(["srun", "-N4", "--ntasks-per-node=1", "-l", "sh", "-c",
                            "echo $SLURM_NODEID $(hostname) $(ip -4 -o addr show ens-priv | awk '{print $4}')"],
                           timeout_s=120)
        assert run.returncode == 0, run.stderr + slurm.log("slurmctld")
        rows = sorted(line.split(": ", 1)[1].split() for line in run.stdout.splitlines())
        assert [(r[0], r[1], r[2].split("/")[0]) for r in rows] == [
            (str(i), h.name, h.priv_ip) for i, h in enumerate(rig.hosts)
        ]
        work = slurm.work
        assert _slurm_pids(rig)
    assert _slurm_pids(rig) == []
    assert not work.exists()
