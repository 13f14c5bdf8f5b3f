"""`k3deploy render --format slurm`, submitted as it is to the Slurm rig: the stand-in on four nodes reaches
ready, each node with the rank Slurm numbered it (SLURM_NODEID, read on the node) and the head's address
taken from the allocation; scancel leaves no engine process."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from k3deploy.errors import ExecError
from k3deploy.executors.http import NodeHttp
from tests.integration.sim_deployments import LAUNCHER, ROOT, cli
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.slurm_cluster import SlurmRig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slurm_cluster,
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="slurm-wlm is not installed "
                       "(scripts/test.sh installs slurmctld slurmd slurm-client munge)"),
]


def slurm_topology(rig: HostRig, checkpoint: Path, tmp: Path, name: str, **slurm: object) -> Path:
    """The stand-in on the rig's hosts by Slurm node name, TP4/EP4, launched through Slurm."""
    doc = {
        "name": name,
        "model": {"id": "kimi-k3-tiny", "path": str(checkpoint)},
        "hardware": {"gpu": "sim", "gpus_per_node": 1},
        "nodes": [{"host": h.name, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig.hosts],
        "engine": {"kind": "sim", "mimic": "sglang", "port": 18000, "launcher": LAUNCHER},
        "parallel": {"tp": 4, "ep": 4},
        "serving": {"context_length": 32768, "max_running_requests": 16},
        "launch": {"executor": "slurm", "port": 29500, "dist_timeout_s": 20, "ready_timeout_s": 60,
                   "stop_grace_s": 3, "log_dir": str(tmp / "logs"), "state_dir": str(tmp / "state"),
                   "slurm": {"partition": "rig", "time_limit": "10:00", **slurm}},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def engines(rig: HostRig) -> dict[str, list[str]]:
    """The stand-in's command lines on each host."""
    out = {}
    for h in rig.hosts:
        ps = rig.exec(h, ["ps", "-ww", "-eo", "args="]).stdout.splitlines()
        out[h.name] = [line for line in ps if line.startswith(f"{sys.executable} -m k3deploy.sim serve")]
    return out


@pytest.mark.timeout(300)
def test_exported_sbatch_submitted_as_is_is_ready_with_ranks_0_to_3(rig4: HostRig, slurm: SlurmRig,
                                                                   checkpoint: Path, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    topo = slurm_topology(rig4, checkpoint, tmp_path, "it-sbatch", nodelist=[h.name for h in rig4.hosts])
    out = tmp_path / "export"
    run = cli("render", str(topo), "--format", "slurm", "--out", str(out))
    assert run.returncode == 0, run.stderr
    script = out / "k3deploy.sbatch"
    sub = slurm.client(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp_path}/job-%j.out",
                        str(script)])
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    log = tmp_path / f"job-{job}.out"
    head = rig4.hosts[0]
    with NodeHttp(f"http://{head.priv_ip}:18000", timeout_s=2) as http:
        def ready() -> bool:
            try:
                return http.get("/v1/models", 2).ok
            except ExecError:  # not up yet (HttpFailure)
                return False
        assert wait_for(ready, 120), (log.read_text()[-3000:] if log.exists() else "") + slurm.log("slurmctld")
    # Host h0N runs rank N-1 (Slurm numbers the nodes in slurm.conf's order, as the topology lists them),
    # with its own address and the head's read from the allocation.
    ranks = {}
    for h in rig4.hosts:
        (line,) = engines(rig4)[h.name]
        rank = re.search(r"--node-rank (\d+)", line)
        addr = re.search(r"--dist-init-addr (\S+)", line)
        assert rank and addr, line
        assert addr.group(1) == f"{head.priv_ip}:29500", line
        ranks[h.name] = int(rank.group(1))
    assert ranks == {h.name: r for r, h in enumerate(rig4.hosts)}, ranks
    state = slurm.client(["scontrol", "show", "job", job]).stdout
    assert "JobState=RUNNING" in state, state
    assert slurm.client(["scancel", job]).returncode == 0
    assert wait_for(lambda: not any(engines(rig4).values()), 60), engines(rig4)


@pytest.mark.timeout(300)
def test_the_time_limit_ends_every_task_of_the_exported_job(rig4: HostRig, slurm: SlurmRig, checkpoint: Path,
                                                             tmp_path: Path) -> None:
    """launch.slurm.time_limit becomes the job's limit: at it Slurm ends the job, and no engine is left."""
    tmp_path.chmod(0o755)
    topo = slurm_topology(rig4, checkpoint, tmp_path, "it-sbatch-limit", time_limit="1")
    out = tmp_path / "export"
    assert cli("render", str(topo), "--format", "slurm", "--out", str(out)).returncode == 0
    sub = slurm.client(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp_path}/job-%j.out",
                        str(out / "k3deploy.sbatch")])
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    assert wait_for(lambda: all(len(e) == 1 for e in engines(rig4).values()), 120), engines(rig4)

    def state() -> str:
        shown = slurm.client(["scontrol", "show", "job", job]).stdout
        found = re.search(r"JobState=(\S+)", shown)
        return found.group(1) if found else ""
    # One minute, then KillWait (5 s) and the controller's own timer: well inside four minutes.
    assert wait_for(lambda: state() == "TIMEOUT", 240), state()
    assert wait_for(lambda: not any(engines(rig4).values()), 60), engines(rig4)
