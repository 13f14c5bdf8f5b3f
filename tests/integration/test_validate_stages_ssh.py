"""Stages kernels, topology and short against the stand-in launched over SSH on four network-namespace hosts
as a simulated H100 cluster (Marlin + FlashMLA rules): a clean deployment passes all three; each stand-in fault
fails exactly its stage with the evidence shown; the same from the rig's login-node namespace through a jump
host (rank 0's API asked on rank 0, every log read through the jump)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.sim_deployments import ROOT, cli
from tests.integration.test_launch_ssh import Deployments, checkpoint, deployments, hosts_empty
from tests.rig import HostRig

pytestmark = pytest.mark.integration
__all__ = ["checkpoint", "deployments"]  # the fixtures, imported
MINE = "kernels,topology,short"
STAGES = ["kernels", "topology", "short"]
GPU = "h100-80gb"


def hopper(deployments: Deployments, name: str, fault: str | None = None,
           nodes: list[dict[str, Any]] | None = None) -> Path:
    """A 4-node TP4/EP4 stand-in topology on simulated H100s (the renderer adds Marlin and FlashMLA)."""
    path = deployments.topology(name, nodes=nodes, env={"K3SIM_FAULT": fault} if fault else None)
    doc = yaml.safe_load(path.read_text())
    doc["hardware"]["gpu"] = GPU  # the stand-in is told through K3SIM_GPU, which the renderer sets from this
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def validated(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(run.stdout)
    return {s["name"]: s for s in report["stages"]} | {"_exit": report["exit_code"]}


@pytest.mark.timeout(180)
def test_a_clean_hopper_deployment_passes_kernels_topology_and_short(deployments: Deployments,
                                                                    rig4: HostRig) -> None:
    topo = hopper(deployments, "vs-clean")
    assert cli("launch", str(topo), "--skip-preflight").returncode == 0
    run = cli("validate", str(topo), "--only", MINE, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    got = validated(run)
    assert [got[s]["status"] for s in STAGES] == ["pass"] * 3
    assert "MoE marlin (Marlin W4A16), attention flashmla" in got["kernels"]["detail"]
    assert "Kimi-K3 on SM90: moe_runner_backend=marlin (Marlin W4A16 kernels)." in got["kernels"]["evidence"]
    assert [n["host"] for n in got["kernels"]["nodes"]] == [h.mgmt_ip for h in rig4.hosts]
    assert "world_size=4, nnodes=4, tp=4, ep=4, dp=1, pp=1, experts_per_rank=8" in got["topology"]["detail"]
    assert [n["detail"] for n in got["topology"]["nodes"]] == [f"DP0 PP0 TP{r} EP{r}" for r in range(4)]
    assert '"reasoning_content": "The user asks' in got["short"]["evidence"]
    assert cli("stop", str(topo)).returncode == 0
    assert hosts_empty(rig4)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("fault", "failing", "evidence"), [
    ("wrong_kernel", "kernels", "moe_runner_backend=triton (asked for marlin)"),
    ("wrong_topology", "topology", "ep: the engine reports 1, the plan says 4"),
    ("no_reasoning_parser", "short", "no reasoning in `reasoning_content`: the reasoning parser did not split it"),
    ("no_tool_parser", "short", "no structured tool_calls: the tool-call parser did not run"),
])
def test_each_fault_fails_exactly_its_stage_with_the_evidence(deployments: Deployments, rig4: HostRig, fault: str,
                                                             failing: str, evidence: str) -> None:
    topo = hopper(deployments, f"vs-{fault.replace('_', '-')}", fault)
    assert cli("launch", str(topo), "--skip-preflight").returncode == 0
    run = cli("validate", str(topo), "--only", MINE, "--json")
    assert run.returncode == 1, run.stdout + run.stderr
    got = validated(run)
    assert {s: got[s]["status"] for s in STAGES} == {s: "fail" if s == failing else "pass" for s in STAGES}
    assert evidence in got[failing]["evidence"], got[failing]["evidence"]
    human = cli("validate", str(topo), "--only", failing)  # the table names the problem too
    assert human.returncode == 1 and "FAIL" in human.stdout, human.stdout
    assert cli("stop", str(topo)).returncode == 0


@pytest.mark.timeout(240)
def test_from_a_login_node_through_a_jump_host(deployments: Deployments, rig4: HostRig) -> None:
    """The login node reaches only h01's management address: logs come through the jump host, requests are
    made on rank 0; a missing tool parser is still caught there, with the raw answer shown."""
    ctl = rig4.controller()

    def ctl_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", ctl, sys.executable, "-m", "k3deploy", *args],
                              capture_output=True, text=True, check=False, timeout=150, cwd=ROOT)

    nodes = [{"host": h.priv_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    topo = hopper(deployments, "vs-bastion", "no_tool_parser", nodes=nodes)
    run = ctl_cli("launch", str(topo), "--skip-preflight", "--ssh-jump", f"root@{rig4.hosts[0].mgmt_ip}", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["probe_from"] == "head"
    done = ctl_cli("validate", str(topo), "--only", MINE, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    got = validated(done)
    assert {s: got[s]["status"] for s in STAGES} == {"kernels": "pass", "topology": "pass", "short": "fail"}
    assert [n["host"] for n in got["kernels"]["nodes"]] == [n["host"] for n in nodes]
    assert "<|tool_calls_section_begin|>" in got["short"]["evidence"]
    assert ctl_cli("stop", str(topo)).returncode == 0
    assert hosts_empty(rig4)
