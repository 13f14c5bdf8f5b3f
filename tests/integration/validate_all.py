"""Every `validate` stage at once against the stand-in on the rig: the topology (simulated H100s, so kernels has
Marlin + FlashMLA to check; the request stages' small settings; a pinned manifest, so shards hashes every file),
and each stand-in fault with the one stage that must fail and the evidence it must show, per engine dialect."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from k3deploy.checkpoint.manifest import Manifest
from tests import figures
from tests.integration.sim_deployments import SimDeployments
from tests.validate_serving import SERVING, VALIDATE

ALL = ("shards", "kernels", "topology", "short", "vision", "long", "prefix-cache", "effort")
SKIPPED = ("accuracy",)  # no dataset in these topologies: the stage says so and skips
GPU = "h100-80gb"
# kimi-k3-tiny on an H100 roofline steps ~1,700x faster than on the `sim` GPU (its steps would be nothing but
# Python overhead): 0.001 paces it as the `sim` GPU at K3SIM_SPEED~1.7, so slow_decode has a step to slow down
# and a step outweighs the stand-in's own cost per token (the effort stage holds it against its prediction).
SPEED = "0.001"
# TP4 decodes ~4x faster than one node: slow_decode's factor and the threshold are set for the rig. Clean runs
# measured ~2,200 tok/s at load 3 and 219 at load 8 beside real vLLM starts (the stand-in's Python cost per token
# grows with the machine's load); slow_decode:60 is paced by sleeps at ~55. The floor sits between, far from both.
MIN_THROUGHPUT = 100.0
SLOW = 60
Expect = dict[str, dict[str, str]]  # stage -> {dialect or "*": pattern searched in its detail and evidence}
# fault -> what fails; every stage not named must pass. Only the faults whose evidence takes an executor's own
# path on the rig (a log read over SSH or through a jump host, the load forwarded through rank 0's tunnel or run
# on the node); every request-stage fault on both dialects: tests/unit/test_validate_fault_grid.py.
FAULTS: dict[str, Expect] = {
    "": {},
    "wrong_kernel": {"kernels": {
        "sglang": r"moe_runner_backend=triton \(asked for marlin\)",
        "vllm": r"No Mxfp4 MoE backend supports activation=silu\. Falling back to 'triton' with BF16"}},
    "wrong_topology": {"topology": {"*": r"ep: the engine reports 1, the plan says 4"}},
    "wrong_cache_state": {"prefix-cache": {"*": r"a cache hit changed the answer: token \d+ is .* on the hit"}},
    f"slow_decode:{SLOW}": {"effort": {"*": rf"cold: [\d,]+ output tokens/s < validate.min_throughput_tok_s "
                                           rf"{MIN_THROUGHPUT:g}(.|\n)*"
                                     r"cold: far below the prediction for this shape .*the decode step runs at "
                                     r"\d+% of its predicted speed"}},
}


def fault_id(fault: str) -> str:
    """The fault as a test id and deployment-name part: `kda_state_lost_beyond-1000`."""
    return fault.replace(":", "-") or "clean"


def topology(deployments: SimDeployments, name: str, fault: str, mimic: str,
             nodes: list[dict[str, Any]] | None = None, launch: dict[str, Any] | None = None) -> Path:
    """A 4-node TP4/EP4 stand-in deployment of `mimic` on simulated H100s with a pinned manifest."""
    env = {"K3SIM_SPEED": SPEED, **({"K3SIM_FAULT": fault} if fault else {})}
    path = deployments.topology(name, nodes=nodes, env=env, launch=launch)
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    manifest = path.with_suffix(".manifest.json")
    Manifest.load(deployments.checkpoint).save(manifest)
    doc["hardware"]["gpu"] = GPU  # the stand-in is told through K3SIM_GPU, which the renderer sets from this
    doc["engine"]["mimic"] = mimic
    doc["engine"]["launcher"] = [sys.executable, "-m", "k3deploy.sim", "serve", "--mimic", mimic]
    doc["serving"] = SERVING
    doc["validate"] = {**VALIDATE, "min_throughput_tok_s": MIN_THROUGHPUT, "manifest": str(manifest)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def check_report(done: subprocess.CompletedProcess[str], fault: str, mimic: str) -> dict[str, Any]:
    """Every stage ran (accuracy skipped: no dataset); exactly the fault's stages failed, each with its evidence; the others passed."""
    report: dict[str, Any] = json.loads(done.stdout)
    stages = {s["name"]: s for s in report["stages"]}
    expected = FAULTS[fault]
    want = {**{name: "fail" if name in expected else "pass" for name in ALL}, **{name: "skip" for name in SKIPPED}}
    assert {n: s["status"] for n, s in stages.items()} == want, {n: (s["status"], s["detail"])
                                                                  for n, s in stages.items()}
    assert done.returncode == report["exit_code"] == (1 if expected else 0), done.stderr
    for name, patterns in expected.items():
        pattern = patterns.get(mimic, patterns.get("*"))
        assert pattern is not None, (fault, name, mimic)
        told = stages[name]["detail"] + "\n" + (stages[name].get("evidence") or "")
        assert re.search(pattern, told, re.MULTILINE), told
    return stages


def launch_validate_stop(run: Callable[..., subprocess.CompletedProcess[str]], topo: Path, fault: str, mimic: str,
                         *launch_args: str) -> dict[str, Any]:
    """Launch (simulated H100s: no nvidia-smi for preflight to ask), validate every stage, always stop; the
    checked stages by name."""
    launched = run("launch", str(topo), "--skip-preflight", *launch_args)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    try:
        if fault:
            figures.fault_injected()
        stages = check_report(run("validate", str(topo), "--json", timeout_s=190), fault, mimic)
    finally:
        stopped = run("stop", str(topo))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    return stages
