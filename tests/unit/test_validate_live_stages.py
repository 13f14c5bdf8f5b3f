"""Stages kernels, topology and short against a running stand-in (2 local "nodes", executor local): a clean
deployment passes all three, on either mimic and on a simulated Hopper; each stand-in fault fails exactly its
stage, with the deciding log line or answer shown. Faults that fail different stages share one launch. A missing
reasoning or tool-call parser fails `short` on both dialects in tests/unit/test_validate_fault_grid.py (caught
streamed and not, the raw markers shown), with the other request stages beside it."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.validate.nodes import fleet_runner
from k3deploy.validate.pipeline import Report
from k3deploy.validate.run import resolve_target, validate
from tests.k3deploy_cli import run_k3deploy
from tests.ports import free_port
from tests.unit.test_launch_support import kill_tagged

# Every test here serves from stand-in nodes, which rendezvous over Gloo: torch (skipped in the 3.10 run).
pytestmark = [pytest.mark.timeout(120), pytest.mark.torch]
MINE = ["kernels", "topology", "short"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_k3deploy(*args, timeout_s=100, env={"K3SIM_SPEED": "4"})


class Running:
    """Launches stand-in deployments and stops each one after the test (nothing may be left)."""

    def __init__(self, tmp: Path, checkpoint: Path) -> None:
        self.tmp, self.checkpoint = tmp, checkpoint
        self.names: list[str] = []

    def launch(self, mimic: str = "sglang", gpu: str = "sim", fault: str | None = None,
               args: dict[str, Any] | None = None) -> Report:
        name = f"ut-stages-{len(self.names)}-{os.getpid() % 10000}"
        self.names.append(name)
        doc = {"name": name, "model": {"id": "kimi-k3-tiny", "path": str(self.checkpoint)},
               "hardware": {"gpu": gpu, "gpus_per_node": 1},
               "nodes": [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(2)],
               "engine": {"kind": "sim", "mimic": mimic, "port": free_port(), "args": args or {},
                          "env": {"K3SIM_FAULT": fault} if fault else {}},
               "parallel": {"tp": 2, "ep": 2},
               "serving": {"context_length": 32768, "max_running_requests": 8},
               "launch": {"executor": "local", "port": free_port(), "dist_timeout_s": 30, "ready_timeout_s": 60,
                          "stop_grace_s": 2, "log_dir": str(self.tmp / "logs"), "state_dir": str(self.tmp / "state")}}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        run = cli("launch", str(path), "--skip-preflight")  # a simulated H100 has no nvidia-smi
        assert run.returncode == 0, run.stderr[-2000:]
        target = resolve_target(str(path))
        assert target.deployment is not None
        return validate(target, fleet_runner, only=MINE)

    def stop_all(self) -> list[int]:
        left = []
        for name in self.names:
            cli("stop", name, "--state-dir", str(self.tmp / "state"))
            left += kill_tagged(f"{name}.")
        return left


@pytest.fixture
def running(tmp_path: Path, checkpoint: Path) -> Iterator[Running]:
    made = Running(tmp_path, checkpoint)
    yield made
    assert made.stop_all() == [], "processes left running"


def statuses(report: Report) -> dict[str, str]:
    return {s.name: s.status for s in report.stages}


def stage(report: Report, name: str) -> Any:
    return next(s for s in report.stages if s.name == name)


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_a_clean_deployment_passes_kernels_topology_and_short(running: Running, mimic: str) -> None:
    report = running.launch(mimic)
    assert statuses(report) == dict.fromkeys(MINE, "pass"), report.model_dump_json(indent=1)
    assert report.exit_code == 0
    kernels, topology, short = (stage(report, n) for n in MINE)
    assert "native MXFP4" in kernels.detail
    moe_line = "moe_runner_backend=flashinfer_mxfp4" if mimic == "sglang" else "Using 'FLASHINFER_TRTLLM_MXFP4_BF16'"
    assert moe_line in kernels.evidence
    assert "world_size=2, nnodes=2, tp=2, ep=2, dp=1, pp=1, experts_per_rank=16" in topology.detail
    assert [n.detail for n in topology.nodes] == ["DP0 PP0 TP0 EP0", "DP0 PP0 TP1 EP1"]
    key = "reasoning_content" if mimic == "sglang" else "reasoning"
    assert f"reasoning in `{key}`" in short.detail and f'"{key}": "The user asks' in short.evidence


def test_hopper_needs_marlin_and_flashmla_and_sees_them(running: Running) -> None:
    report = running.launch("sglang", gpu="h100-80gb")
    assert statuses(report) == dict.fromkeys(MINE, "pass"), report.model_dump_json(indent=1)
    kernels = stage(report, "kernels")
    assert "MoE marlin (Marlin W4A16), attention flashmla" in kernels.detail
    assert "decode_attention_backend='flashmla'" in kernels.evidence


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_moe_fallback_and_topology_mismatch_fail_kernels_and_topology_only(running: Running, mimic: str) -> None:
    """Two faults in one launch (they fail different stages): the MoE kernel falls back on Hopper, and the engine
    runs without expert parallelism."""
    report = running.launch(mimic, gpu="h100-80gb", fault="wrong_kernel,wrong_topology")
    assert statuses(report) == {"kernels": "fail", "topology": "fail", "short": "pass"}, report.model_dump_json()
    kernels = stage(report, "kernels")
    assert [n.status for n in kernels.nodes] == ["fail", "fail"]
    if mimic == "sglang":
        assert "MoE kernel triton (experts upcast to BF16), needs Marlin W4A16" in kernels.detail
        assert "moe_runner_backend=triton (asked for marlin)" in kernels.evidence
    else:
        assert "fallback: " in kernels.detail
        assert "No Mxfp4 MoE backend supports activation=silu. Falling back to 'triton' with BF16" in kernels.evidence
    topology = stage(report, "topology")
    assert "ep: the engine reports 1, the plan says 2" in topology.evidence
    assert "experts_per_rank: the engine reports 32, the plan says 16" in topology.evidence
    if mimic == "sglang":  # node 1 logs as EP rank 0: its own lines say so
        assert [n.status for n in topology.nodes] == ["pass", "fail"]
        assert "logs as DP0 PP0 TP1 EP0, the plan puts DP0 PP0 TP1 EP1 here" in topology.nodes[1].detail
    else:  # vLLM's EP group spans DP x TP whether experts are split or not: only the [EP Rank] line tells
        assert [n.detail for n in topology.nodes] == ["DP0 PP0 TP0 EP0", "DP0 PP0 TP1 EP1"]
        assert "no [EP Rank] line: expert parallelism is off" in topology.evidence
    source = "/server_info: tp_size=2 ep_size=1" if mimic == "sglang" else "rank 0's non-default args: {tensor_parallel_size: 2"
    assert source in topology.evidence


def started_log(tmp: Path, checkpoint: Path, mimic: str, gpu: str, *flags: str) -> str:
    """The start-up log of one stand-in node run by hand (flags the planner would refuse to render)."""
    from k3deploy.sim.local_nodes import NodeSet

    with NodeSet(tmp) as nodes:
        node = nodes.start("one", ["--mimic", mimic, str(checkpoint), "--port", str(free_port()), *flags],
                           {"K3SIM_GPU": gpu})
        node.wait_for("fired up and ready to roll|Starting vLLM server", 60)
        return node.text()


@pytest.mark.parametrize(("mimic", "gpu", "flags", "verdict"), [
    # SGLang `auto` on SM90 upcasts silently: only the argument dump tells (the planner refuses to render it).
    ("sglang", "h100-80gb", ["--moe-runner-backend", "auto"], "MoE kernel auto (experts upcast to BF16), needs Marlin"),
    # Marlin where FP4 tensor cores exist wastes them.
    ("vllm", "b200", ["--moe-backend", "marlin"], "MoE kernel MARLIN (Marlin W4A16), needs native MXFP4"),
    ("vllm", "h100-80gb", ["--moe-backend", "marlin", "--attention-backend", "TRITON_MLA"],
     "attention backend TRITON_MLA, needs flashmla"),
])
def test_kernels_read_the_stand_ins_own_start_up_log(tmp_path: Path, checkpoint: Path, mimic: str, gpu: str,
                                                     flags: list[str], verdict: str) -> None:
    from k3deploy.catalog.loader import load_catalog
    from k3deploy.engines.kernels import kernel_needs
    from k3deploy.engines.log_lines import log_lines
    from k3deploy.validate.stages.kernels import read_kernels

    text = started_log(tmp_path, checkpoint, mimic, gpu, *flags)
    needs = kernel_needs(load_catalog().hardware[gpu], mimic)
    found = read_kernels(text, log_lines(mimic), needs)  # type: ignore[arg-type]
    assert any(p.startswith(verdict) for p in found.problems), found
    if mimic == "vllm" and gpu == "h100-80gb":  # on Hopper Marlin is right, and its FP4 warning is logged
        assert "does not have native support for FP4 computation" in text
