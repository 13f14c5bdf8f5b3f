"""`k3deploy weights status` and `weights sync` with launch.executor slurm on the Slurm rig: the nodes are reached
as steps of a job held for the command (the allocation seam preflight uses: submitted, placed, cancelled on the
way out), each host with its own disk at the checkpoint path, the source h01's own directory (`--from h01:DIR`),
every file pulled node to node over HTTP between the hosts' private addresses (tests/integration/weights_rig.py).
A node lost mid-sync (its step processes killed) is named while the others finish; `launch --sync-weights` then
completes it (sending only what it lacks) before the stand-in starts on that checkpoint."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from k3deploy.checkpoint.manifest import Manifest
from tests.integration.sim_deployments import engine_pids
from tests.integration.test_sbatch_export_slurm import engines, slurm_topology
from tests.integration.weights_rig import (
    WeightsDisks,
    copies,
    mid_sync,
    own_disks,
    slowed,
    status_sync_status,
)
from tests.k3deploy_cli import run_k3deploy, start_k3deploy
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


RATE = 4_000_000  # bytes/s on every private link while a node is lost: a shard (3.2 MB) takes ~0.8 s a hop


def kill_copy(rig: HostRig, d: WeightsDisks, i: int) -> bool:
    """Once host i is mid-sync (weights_rig.mid_sync), SIGKILL its sync process: True once done."""
    pids = copies(rig, i) if mid_sync(rig, d, i) else []
    return bool(pids) and rig.exec(rig.hosts[i], ["kill", "-KILL", *pids]).returncode == 0


def engine_started(rig: HostRig, i: int) -> float:
    """When the stand-in on host i started (seconds since the epoch, to the clock tick)."""
    (pid,) = engine_pids(rig, rig.hosts[i].name)
    stat = rig.exec(rig.hosts[i], ["cat", f"/proc/{pid}/stat"]).stdout
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
    booted = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    return booted + ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(240)
def test_a_node_lost_mid_sync_is_named_and_launch_sync_weights_completes_it_before_the_engine(
        slurm: SlurmRig, rig4: HostRig, checkpoint_manifest: tuple[Path, Manifest], tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    ckpt, man = checkpoint_manifest
    env = {"SLURM_CONF": str(slurm.conf_path)}
    want = {n: f.sha256 for n, f in man.files.items()}
    with own_disks(rig4, tmp_path, {n: (ckpt / n).read_bytes() for n in man.files}) as d:
        topo = slurm_topology(rig4, Path(d.at), tmp_path, "w-slurm-lost")
        doc = yaml.safe_load(topo.read_text())
        doc["validate"] = {"manifest": str(d.manifest)}  # what launch --sync-weights syncs against
        topo.write_text(yaml.safe_dump(doc, sort_keys=False))
        with slowed(rig4, RATE) as lift:
            proc = start_k3deploy("weights", "sync", topo, "--from", f"h01:{d.src}", "--json", env=env)
            try:
                killed = wait_for(lambda: kill_copy(rig4, d, 2), 120)
                lift()  # the rest at full speed
            finally:
                out, err = proc.communicate(timeout=180)
        assert killed, err
        assert proc.returncode == 3 and "Traceback" not in err, err
        nodes = json.loads(out)["nodes"]
        lost = nodes[2]["error"] or ""
        # The node, and what ended its copy.
        assert lost.startswith(f"h03: the sync's process at {d.at} ended with ") and lost.endswith(" files to go"), \
            nodes[2]
        assert [n["error"] for i, n in enumerate(nodes) if i != 2] == [None] * 3, nodes
        held = [d.finals(i) for i in range(4)]
        assert held[0] == held[1] == held[3] == want, held  # h04 finished, pulling past h03
        assert 0 < len(held[2]) < len(want) and all(want[n] == sha for n, sha in held[2].items()), held[2]
        kept = {(i, n): (d.tmp / f"disk{i}" / n).stat().st_ino for i in range(4) for n in held[i]}

        run = run_k3deploy("launch", topo, "--sync-weights", f"h01:{d.src}", "--skip-preflight", "--json",
                           timeout_s=180, env=env)
        try:
            assert run.returncode == 0, run.stderr + run.stdout[-3000:]
            rec = json.loads(run.stdout)
            assert rec["status"] == "ready" and [n["host"] for n in rec["nodes"]] == [h.name for h in rig4.hosts]
            # The launch's job asked for the nodes the sync's job had filled (its own job, cancelled before).
            job = slurm.client(["scontrol", "show", "job", str(rec["slurm_job"]["job_id"])]).stdout
            asked = re.search(r"ReqNodeList=(\S+)", job)
            assert asked, job
            names = slurm.client(["scontrol", "show", "hostnames", asked.group(1)]).stdout.split()
            assert names == [h.name for h in rig4.hosts], job
            assert [d.finals(i) for i in range(4)] == [want] * 4
            # Verified files were not sent again (a new copy lands under a new inode).
            assert {k: (d.tmp / f"disk{k[0]}" / k[1]).stat().st_ino for k in kept} == kept
            # The sync came first: h03's engine started after its last file was written.
            last = max((d.tmp / "disk2" / n).stat().st_mtime for n in want)
            assert engine_started(rig4, 2) > last, (engine_started(rig4, 2), last)
        finally:
            stop = run_k3deploy("stop", topo, timeout_s=120, env=env)
        assert stop.returncode == 0, stop.stderr
        assert wait_for(lambda: not any(engines(rig4).values()), 60), engines(rig4)
    assert wait_for(lambda: not slurm.client(["squeue", "-h", "-o", "%i"]).stdout.strip(), 60), \
        slurm.client(["squeue", "-h", "-o", "%i %T %j"]).stdout
    assert wait_for(lambda: not any(started(rig4).values()), 30), started(rig4)
