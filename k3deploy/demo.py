"""`k3deploy demo`: the whole flow on this machine: the tiny checkpoint, a plan, four local stand-in nodes,
every validation stage that exists, then a stop (unless kept running)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from k3deploy.extras import require

if TYPE_CHECKING:
    from k3deploy.launch.events import NodeEvent
    from k3deploy.records.deployment import Deployment
    from k3deploy.validate.pipeline import Report
    from k3deploy.validate.stage import ProgressEvent, StageResult

DEMO_NAME = "k3-demo"
DEMO_NODES = 4


def demo_topology(workdir: Path, http_port: int, dist_port: int) -> dict[str, Any]:
    """kimi-k3-tiny on 4 stand-in nodes (SGLang mimic, TP4/EP4), each a local process on 127.0.0.x."""
    return {
        "name": DEMO_NAME,
        "model": {"id": "kimi-k3-tiny", "path": str(workdir / "kimi-k3-tiny"), "revision": "tiny-r1"},
        "hardware": {"gpu": "sim", "gpus_per_node": 1},
        "nodes": [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(DEMO_NODES)],
        "engine": {"kind": "sim", "mimic": "sglang", "port": http_port},
        "parallel": {"tp": DEMO_NODES, "ep": DEMO_NODES},
        "serving": {"context_length": 32768, "max_running_requests": 16, "reasoning_effort": "high"},
        "launch": {"executor": "local", "port": dist_port, "dist_timeout_s": 60, "ready_timeout_s": 120,
                   "stop_grace_s": 3, "log_dir": str(workdir / "logs"), "state_dir": str(workdir / "state")},
        "validate": {"long_request_tokens": 16384, "concurrency": 4, **accuracy_settings()},
    }


def accuracy_settings() -> dict[str, Any]:
    """The shipped recall dataset for the accuracy stage, when lm-eval (the `accuracy` extra) is here to run it;
    without it the stage skips, saying it has no dataset."""
    import importlib.util

    from k3deploy.validate.accuracy import BUILTIN_DATASET

    return {"accuracy_dataset": str(BUILTIN_DATASET)} if importlib.util.find_spec("lm_eval") else {}


def prepare(workdir: Path) -> Path:
    """Write the tiny checkpoint if missing and the demo topology (free ports); return the topology file."""
    from k3deploy.sim.checkpoint import write_checkpoint
    from k3deploy.sim.local_nodes import free_ports

    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / "kimi-k3-tiny"
    if not (checkpoint / "config.json").is_file():
        write_checkpoint(checkpoint)
    http_port, dist_port = free_ports(2)
    path = workdir / "demo.yaml"
    path.write_text("# Written by `k3deploy demo`; usable with every other command.\n"
                    + yaml.safe_dump(demo_topology(workdir, http_port, dist_port), sort_keys=False))
    return path


@dataclass(frozen=True)
class DemoResult:
    """What the demo did: its topology file, the deployment as launched, the validation report."""

    topology_file: Path
    deployment: Deployment
    report: Report
    kept: bool


def run_demo(workdir: Path, *, keep: bool = False, on_event: Callable[[NodeEvent], None] = lambda e: None,
             on_stage: Callable[[str, StageResult | None], None] = lambda n, r: None,
             progress: Callable[[ProgressEvent], None] = lambda e: None,
             on_step: Callable[[str], None] = lambda s: None) -> DemoResult:
    """Prepare, plan, launch, validate, and stop unless `keep` (then a supervisor watches it)."""
    from k3deploy.launch import deploy
    from k3deploy.nodeplan.jobs import jobs_for
    from k3deploy.planning.files import catalog_for, require_feasible
    from k3deploy.records.store import StateStore
    from k3deploy.validate.nodes import fleet_runner
    from k3deploy.validate.run import resolve_target, validate

    require("sim", "validate", what="the demo (the stand-in engine and every validation stage)")
    on_step(f"checkpoint and topology in {workdir}")
    path = prepare(workdir)
    catalog = catalog_for(None)
    plan = require_feasible(path, catalog)
    on_step("plan: feasible; launching 4 local stand-in nodes")
    store = StateStore(workdir / "state")
    dep = deploy.launch(plan, jobs_for(plan, None, catalog), store, on_event=on_event, background=keep)
    try:
        on_step(f"ready at {dep.url}; validating")
        report = validate(resolve_target(str(path)), fleet_runner, progress=progress, on_stage=on_stage)
    finally:
        if not keep:
            on_step("stopping every node")
            dep, _ = deploy.stop(store, DEMO_NAME)
    return DemoResult(path, dep, report, keep)
