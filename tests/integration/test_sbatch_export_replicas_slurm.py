"""`k3deploy render --format slurm` of 2 replicas x 2 nodes of the stand-in behind the real smg, submitted as
it is to the Slurm rig: one job, each replica its own step on its own two nodes, the router a step on the node
router.runs_on names (the last: replica 1's rank 1, no head, so its address is read there); the router
registers both replicas and answers a completion; scancel leaves no engine and no router."""
from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.sim_deployments import LAUNCHER, ROOT, cli
from tests.integration.test_sbatch_export_slurm import engines
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.slurm_cluster import SlurmRig

VENV = Path(os.environ.get("K3DEPLOY_ROUTERS_VENV") or Path.home() / ".cache" / "k3deploy" / "routers")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slurm_cluster,
    pytest.mark.skipif(not (VENV / ".k3deploy-routers-ready").is_file(),
                       reason=f"no routers venv at {VENV} (scripts/test.sh makes it with scripts/routers_venv.sh)"),
]
ROUTER_PORT = 30300


def replicas_topology(rig: HostRig, checkpoint: Path, tmp: Path) -> Path:
    """2 replicas of the stand-in, TP2/EP2 each, on the rig's four hosts, behind smg from the routers venv."""
    doc = {
        "name": "it-sbatch-replicas",
        "model": {"id": "kimi-k3-tiny", "path": str(checkpoint)},
        "hardware": {"gpu": "sim", "gpus_per_node": 1},
        "nodes": [{"host": h.name, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig.hosts],
        "engine": {"kind": "sim", "mimic": "sglang", "port": 18000, "launcher": LAUNCHER},
        "replicas": 2,
        "router": {"kind": "smg", "runs_on": rig.hosts[3].name, "port": ROUTER_PORT,
                   "python": str(VENV / "bin" / "python"), "policy": "round_robin"},
        "parallel": {"tp": 2, "ep": 2},
        "serving": {"context_length": 32768, "max_running_requests": 16},
        "launch": {"executor": "slurm", "port": 29500, "dist_timeout_s": 20, "ready_timeout_s": 60,
                   "stop_grace_s": 3, "log_dir": str(tmp / "logs"), "state_dir": str(tmp / "state"),
                   "slurm": {"partition": "rig", "time_limit": "10:00", "nodelist": [h.name for h in rig.hosts]}},
    }
    path = tmp / "it-sbatch-replicas.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def routers(rig: HostRig, host: int = 3) -> list[str]:
    """The router's processes on one host (smg retitles itself `smg::router`) and the srun step that runs it."""
    ps = rig.exec(rig.hosts[host], ["ps", "-ww", "-eo", "args="]).stdout.splitlines()
    return [line for line in ps if line.strip() == "smg::router" or "smg.launch_router" in line]


@pytest.mark.timeout(420)
def test_exported_replicas_job_serves_through_smg_and_scancel_ends_everything(rig4: HostRig, slurm: SlurmRig,
                                                                               checkpoint: Path,
                                                                               tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    out = tmp_path / "export"
    run = cli("render", str(replicas_topology(rig4, checkpoint, tmp_path)), "--format", "slurm", "--out", str(out))
    assert run.returncode == 0, run.stderr
    head = rig4.hosts[0]
    url = f"http://{rig4.hosts[3].priv_ip}:{ROUTER_PORT}"
    sub = slurm.client(["sbatch", "--parsable", f"--chdir={ROOT}", f"--output={tmp_path}/job-%j.out",
                        str(out / "k3deploy.sbatch")])
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    log = tmp_path / f"job-{job}.out"

    def job_log() -> str:
        return (log.read_text()[-4000:] if log.exists() else "") + slurm.log("slurmctld")[-2000:]

    def healthy() -> list[str]:
        try:
            r = httpx.get(f"{url}/workers", timeout=5)
            workers = r.json().get("workers", []) if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return []
        return sorted(str(w.get("url")) for w in workers if w.get("is_healthy"))

    want = [f"http://{head.priv_ip}:18000", f"http://{rig4.hosts[2].priv_ip}:18001"]
    assert wait_for(lambda: healthy() == want, 240), (healthy(), job_log())
    # Each replica on its own two nodes, each node with its rank within its replica's step.
    for h, (rank, rendezvous) in zip(rig4.hosts, [(0, head), (1, head), (0, rig4.hosts[2]),
                                                   (1, rig4.hosts[2])]):
        (line,) = engines(rig4)[h.name]
        assert f"--node-rank {rank}" in line and f"--dist-init-addr {rendezvous.priv_ip}:" in line, line
    deadline, answer = time.monotonic() + 120, None
    while answer is None and time.monotonic() < deadline:
        try:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": "kimi-k3-tiny", "max_tokens": 8,
                "messages": [{"role": "user", "content": "Say hello."}]})
            if r.status_code == 200:
                answer = r.json()
        except httpx.HTTPError:
            pass
        if answer is None:
            time.sleep(1)
    assert answer is not None, job_log()
    said = answer["choices"][0]["message"]  # 8 tokens may all go to the reasoning K3 writes first
    assert (said.get("content") or said.get("reasoning_content")) and answer["usage"]["completion_tokens"] > 0
    assert "smg::router" in routers(rig4), routers(rig4)
    # Node 0 runs the batch script, so its `srun ... smg.launch_router` client is there; the router is not.
    assert all("smg::router" not in routers(rig4, h) for h in range(3)), [routers(rig4, h) for h in range(3)]
    assert slurm.client(["scancel", job]).returncode == 0
    assert wait_for(lambda: not any(engines(rig4).values()) and not routers(rig4), 60), \
        (engines(rig4), routers(rig4))
