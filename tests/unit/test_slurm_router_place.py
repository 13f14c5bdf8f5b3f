"""The sbatch export of replicas and roles puts the router where `router.runs_on` says: a node of the topology is
the job's node running that node's rank (its address read there), `local` is not in the job (the job prints the
command, with the instances' addresses, to run where k3deploy runs); the job text stays shellcheck-clean."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from k3deploy.planning.rendering import render_files
from tests.unit.test_render_support import doc_of, plan_of

REPLICAS, PD_SGLANG, PD_VLLM = "replicas-h200-2x2x8-smg", "pd-h200-1p1d-sglang", "pd-h200-1p1d-vllm"


def job(stem: str, **patch: Any) -> str:
    return render_files(plan_of(doc_of(stem, **patch)), "slurm")[0].content


def router_step(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("srun --overlap")]
    return line


def instance_steps(text: str) -> list[int]:
    """The line numbers of the instances' steps."""
    return [i for i, line in enumerate(text.splitlines()) if line.startswith("srun --nodes=2")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("stem", "runs_on", "relative", "address"), [
    (REPLICAS, "node-0", 0, "K3_HEAD_IP_0"),      # replica 0's head
    (REPLICAS, "node-2", 2, "K3_HEAD_IP_1"),      # replica 1's head
    (REPLICAS, "10.0.0.13", 3, "K3_ROUTER_IP"),   # by ip: replica 1's rank 1, not a head
    (PD_SGLANG, "decode-0", 2, "K3_HEAD_IP_1"),   # the shipped topology: the first decode node
    (PD_SGLANG, "prefill-1", 1, "K3_ROUTER_IP"),
])
def test_the_router_runs_on_the_node_runs_on_names(stem: str, runs_on: str, relative: int, address: str) -> None:
    text = job(stem, **{"router.runs_on": runs_on})
    step = router_step(text)
    assert f"--relative={relative} " in step and step.endswith(" &")
    assert f'--host "${{{address}}}"' in step and f'--prometheus-host "${{{address}}}"' in step
    assert f'echo "k3deploy: router smg at http://${{{address}}}:30000"' in text
    lines = text.splitlines()
    probes = [i for i, line in enumerate(lines) if line.startswith("K3_ROUTER_IP=")]
    if address == "K3_ROUTER_IP":  # its address is read on it before any instance's step holds the node
        (probe,) = probes
        assert f"--relative={relative} " in lines[probe] and probe < instance_steps(text)[0]
    else:
        assert probes == []


@pytest.mark.timeout(60)
def test_the_node_is_the_topologys_not_a_place_in_the_node_list() -> None:
    """With replica 0 on node-2/3 (replica_nodes), node-0 is replica 1's head: the job's node 2."""
    text = job(REPLICAS, **{"replica_nodes": [["node-2", "node-3"], ["node-0", "node-1"]], "router.runs_on": "node-0"})
    step = router_step(text)
    assert "--relative=2 " in step and '--host "${K3_HEAD_IP_1}"' in step


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stem", [REPLICAS, PD_VLLM])
def test_runs_on_local_prints_the_command_to_run_where_k3deploy_runs(stem: str, tmp_path: Path) -> None:
    python = "/opt/router venv/bin/py'thon$HOME"  # hostile: must arrive as one word, verbatim
    plan = plan_of(doc_of(stem, **{"router.runs_on": "local", "router.python": python}))
    text = render_files(plan, "slurm")[0].content
    assert "srun --overlap" not in text and "K3_ROUTER_IP" not in text
    (say,) = [line for line in text.splitlines() if line.startswith("printf '%s\\n' ")]
    assert text.splitlines().index(say) > instance_steps(text)[-1]  # once every instance's head is known
    heads = {"K3_HEAD_IP_0": "10.9.0.1", "K3_HEAD_IP_1": "10.9.0.3"}
    out = subprocess.run(["sh", "-c", say], capture_output=True, text=True, check=True, env=heads,
                         timeout=30).stdout
    argv = shlex.split(out)
    assert argv[0] == python and argv[1] == "-m" and argv[2].endswith(".launch_router")
    assert plan.router is not None
    s = plan.router.settings
    assert argv[argv.index("--host") + 1] == s.listen == "127.0.0.1"  # the plan's: the host running k3deploy
    urls = [w for w in argv if w.startswith("http://")]
    ports = [8000, 8001]
    assert urls == [f"http://{ip}:{port}" for ip, port in zip(heads.values(), ports)]
    assert "router.runs_on: local" in text


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (CI installs it)")
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("stem", "runs_on"), [(REPLICAS, "node-3"), (REPLICAS, "local"), (PD_SGLANG, "prefill-1")])
def test_the_job_text_is_shellcheck_clean(stem: str, runs_on: str, tmp_path: Path) -> None:
    path = tmp_path / "k3deploy.sbatch"
    path.write_text(job(stem, **{"router.runs_on": runs_on}))
    r = subprocess.run([str(shutil.which("shellcheck")), "-s", "sh", str(path)], check=False, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout
