"""`k3deploy launch` with launch.executor slurm on the Slurm rig (slurmctld here, one slurmd per namespace
host): the stand-in as one 4-node job, ready with ranks 0-3 on the allocation's nodes; status (scontrol),
logs, validate and stop as in the SSH tier; and the faults Slurm brings, each named by node and leaving no
engine process: a node's slurmd killed, the job cancelled from outside, the time limit, a node drained."""
from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.launch.ipc import ipc_dir
from tests.integration.sim_deployments import GLOO
from tests.integration.test_sbatch_export_slurm import engines, slurm_topology
from tests.k3deploy_cli import run_k3deploy
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.slurm_cluster import SlurmRig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slurm_cluster,
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="slurm-wlm is not installed "
                       "(scripts/test.sh installs slurmctld slurmd slurm-client munge)"),
]


@pytest.fixture
def topo(rig4: HostRig, checkpoint: Path, tmp_path: Path, slurm: SlurmRig) -> Iterator[Path]:
    tmp_path.chmod(0o755)
    path = slurm_topology(rig4, checkpoint, tmp_path, "it-slurm")
    yield path
    # Whatever a test left: the deployment stopped, every node back to idle for the next test.
    cli(slurm, "stop", str(path))
    for h in rig4.hosts:
        slurm.client(["scontrol", "update", f"nodename={h.name}", "state=resume"])
    assert wait_for(lambda: set(slurm.node_states().values()) == {"idle"}, 120), slurm.node_states()


def cli(slurm: SlurmRig, *args: str, timeout_s: float = 240) -> Any:
    return run_k3deploy(*args, timeout_s=timeout_s, env={"SLURM_CONF": str(slurm.conf_path)})


def job_state(slurm: SlurmRig, job: int) -> str:
    shown = slurm.client(["scontrol", "show", "job", str(job)]).stdout
    found = re.search(r"JobState=(\S+)", shown)
    return found.group(1) if found else ""


def launched(slurm: SlurmRig, topo: Path, *flags: str) -> dict[str, Any]:
    run = cli(slurm, "launch", str(topo), "--json", *flags)
    assert run.returncode == 0, run.stderr + run.stdout[-3000:] + slurm.log("slurmctld")
    rec: dict[str, Any] = json.loads(run.stdout)
    return rec


def ranks_by_host(rig: HostRig) -> dict[str, int]:
    out = {}
    for host, lines in engines(rig).items():
        (line,) = lines
        found = re.search(r"--node-rank (\d+)", line)
        assert found, line
        out[host] = int(found.group(1))
    return out


@pytest.mark.timeout(420)
def test_launch_status_logs_validate_stop_on_one_job(slurm: SlurmRig, rig4: HostRig, topo: Path) -> None:
    doc = yaml.safe_load(topo.read_text())
    doc["engine"]["env"] = GLOO
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    rec = launched(slurm, topo)
    assert rec["status"] == "ready" and rec["executor"] == "slurm" and rec["preflight"] == "passed", rec
    job = rec["slurm_job"]["job_id"]
    hosts = [h.name for h in rig4.hosts]
    assert [n["host"] for n in rec["nodes"]] == hosts
    assert {n["handle"]["tag"].split(".")[-2] for n in rec["nodes"]} == {"0", "1", "2", "3"}
    assert job_state(slurm, job) == "RUNNING"
    # Rank N on the allocation's node N (SLURM_NODEID), each engine the handle's process.
    assert ranks_by_host(rig4) == {h: r for r, h in enumerate(hosts)}
    status = cli(slurm, "status", str(topo), "--json")
    assert status.returncode == 0, status.stderr
    rep = json.loads(status.stdout)
    assert rep["ready"] is True and rep["supervised"] is True, rep
    assert all(n["alive"] for n in rep["nodes"]), rep["nodes"]
    assert rep["slurm"] == f"job {job} RUNNING on {','.join(hosts)}", rep
    logs = cli(slurm, "logs", str(topo), "--lines", "5")
    assert logs.returncode == 0, logs.stderr
    for r, h in enumerate(hosts):
        assert f"[{r} {h}] " in logs.stdout, logs.stdout
    head_log = cli(slurm, "logs", str(topo), "--node", "0", "--lines", "200")
    assert "k3sim: torch.distributed gloo group up" in head_log.stdout  # real Gloo across the job's nodes
    val = cli(slurm, "validate", str(topo), "--only", "shards,topology,short")
    assert val.returncode == 0, val.stdout[-3000:] + val.stderr
    stop = cli(slurm, "stop", str(topo))
    assert stop.returncode == 0, stop.stderr + stop.stdout
    assert wait_for(lambda: not any(engines(rig4).values()), 60), engines(rig4)
    assert wait_for(lambda: job_state(slurm, job) not in ("RUNNING", "PENDING"), 60), job_state(slurm, job)
    again = cli(slurm, "stop", str(topo))
    assert again.returncode == 0, again.stderr


def failed_status(slurm: SlurmRig, topo: Path) -> dict[str, Any]:
    """`status --json` once the supervisor has recorded the deployment as failed (exit 4)."""
    seen: dict[str, Any] = {}

    def failed() -> bool:
        run = cli(slurm, "status", str(topo), "--json")
        seen.update(json.loads(run.stdout) if run.stdout.strip() else {"stderr": run.stderr})
        return run.returncode == 4 and seen.get("status") == "failed"
    assert wait_for(failed, 240, step_s=2), seen
    return seen


def inflict(fault: str, slurm: SlurmRig, rig: HostRig, job: int) -> None:
    victim = rig.hosts[2]
    if fault == "scancel":
        assert slurm.client(["scancel", str(job)]).returncode == 0
    elif fault == "drain":
        drained = slurm.client(["scontrol", "update", f"nodename={victim.name}", "state=drain", "reason=k3-maintenance"])
        assert drained.returncode == 0, drained.stderr
    elif fault == "slurmd":
        slurm.kill_slurmd(victim)
    # "time limit": launch.slurm.time_limit is one minute; Slurm ends the job by itself.


@pytest.mark.timeout(480)
@pytest.mark.parametrize("fault", ["scancel", "drain", "slurmd", "time limit"])
def test_a_slurm_fault_is_named_by_node_and_leaves_no_engine(slurm: SlurmRig, rig4: HostRig, checkpoint: Path,
                                                            tmp_path: Path, topo: Path, fault: str) -> None:
    if fault == "time limit":
        topo = slurm_topology(rig4, checkpoint, tmp_path, "it-slurm", time_limit="1")
    # Preflight's probes in the launch's job: test_launch_status_logs_validate_stop_on_one_job (10-20 s each).
    rec = launched(slurm, topo, "--skip-preflight")
    job = rec["slurm_job"]["job_id"]
    dirs = [ipc_dir(n["handle"]["tag"]) for n in rec["nodes"]]
    assert all(os.path.isdir(d) for d in dirs), dirs  # the engines' own, on the hosts' shared /tmp
    try:
        inflict(fault, slurm, rig4, job)
        rep = failed_status(slurm, topo)
        failure = rep["failure"]
        assert failure["rank"] is not None and failure["host"] == rig4.hosts[failure["rank"]].name, failure
        expected = {"scancel": "scancel", "drain": "DRAIN", "slurmd": f"node failure on {rig4.hosts[2].name}",
                    "time limit": "time limit"}[fault]
        assert expected in failure["cause"], failure
        if fault in ("drain", "slurmd"):
            assert failure["rank"] == 2, failure
        assert wait_for(lambda: not any(engines(rig4).values()), 120), engines(rig4)
        assert wait_for(lambda: job_state(slurm, job) not in ("RUNNING", "PENDING"), 120), job_state(slurm, job)
        # Each node's IPC directory went with its engine, though no stop could reach a node of an ended job.
        assert wait_for(lambda: not any(os.path.exists(d) for d in dirs), 30), [d for d in dirs if os.path.exists(d)]
    finally:
        if fault == "slurmd":
            slurm.start_slurmd(rig4.hosts[2])


@pytest.mark.timeout(300)
def test_preflight_probes_the_nodes_of_a_held_job_and_cancels_it(slurm: SlurmRig, rig4: HostRig, topo: Path) -> None:
    run = cli(slurm, "preflight", str(topo), "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    report = json.loads(run.stdout)
    hosts = {row["host"] for check in report["checks"] for row in check["verdicts"]}
    assert hosts == {h.name for h in rig4.hosts}, report
    assert not any(engines(rig4).values()), engines(rig4)
    queue = slurm.client(["squeue", "-h", "-o", "%i %T"])
    assert wait_for(lambda: not slurm.client(["squeue", "-h", "-t", "PD,R", "-o", "%i"]).stdout.strip(), 60), queue.stdout
