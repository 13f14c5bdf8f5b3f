"""Request-stage test helpers: a stand-in deployment launched for real on this machine (local executor, one
or more loopback "nodes"), small enough to validate in seconds, with K3SIM_FAULT set on its engine."""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.k3deploy_cli import run_k3deploy as cli
from tests.ports import free_port

# Small on purpose: a long request of ~3k tokens, a 1.5k-token shared prefix, light load.
# min_share_of_prediction: the stand-in's own Python and HTTP cost per token and request is no part of any
# prediction; at K3SIM_SPEED 8 a clean run's output ran at ~45% of its prediction on a loaded 2-core runner
# (SPEED 4 halves that cost's share); slow_decode's default 10x runs decode at ~10%.
VALIDATE = {"long_request_tokens": 3000, "answer_max_tokens": 512, "prefix_cache_tokens": 1536,
            "concurrency": 4, "effort_requests": 8, "effort_prompt_tokens": 256, "effort_max_tokens": 512,
            "request_timeout_s": 60, "min_share_of_prediction": 0.2}
SERVING = {"context_length": 8192, "max_running_requests": 16, "reasoning_effort": "low"}
SPEED = "4"
# The slow_decode fault's throughput sits well under this; a clean stand-in well above (see bench/).
MIN_THROUGHPUT = 300.0


def sim_topology(tmp: Path, name: str, checkpoint: Path, *, fault: str = "", nodes: int = 1, mimic: str = "sglang",
                 env: Mapping[str, str] | None = None, validate: Mapping[str, Any] | None = None) -> Path:
    """A kimi-k3-tiny stand-in deployment over `nodes` loopback addresses on a free port."""
    doc = {"name": name, "model": {"id": "kimi-k3-tiny", "path": str(checkpoint)},
           "hardware": {"gpu": "sim", "gpus_per_node": 1},
           "nodes": [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(nodes)],
           "engine": {"kind": "sim", "mimic": mimic, "port": free_port(),
                      "env": {"K3SIM_SPEED": SPEED, **({"K3SIM_FAULT": fault} if fault else {}), **(env or {})}},
           "parallel": {"tp": nodes, "ep": nodes},
           "serving": SERVING,
           "launch": {"executor": "local", "port": free_port(), "dist_timeout_s": 30, "ready_timeout_s": 60,
                      "stop_grace_s": 3, "log_dir": str(tmp / "logs"), "state_dir": str(tmp / "state")},
           "validate": {**VALIDATE, "min_throughput_tok_s": MIN_THROUGHPUT, **(validate or {})}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@contextmanager
def launched(topology: Path) -> Iterator[Path]:
    """Launch (the CLI, detached supervisor; no preflight: what these tests validate is the serving, and a local
    launch's preflight: test_preflight_checks.py's test_preflight_and_launch_on_local_nodes) and always stop."""
    done = cli("launch", str(topology), "--skip-preflight")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield topology
    finally:
        cli("stop", str(topology))


def validate_json(topology: Path, *stages: str, html: Path | None = None) -> dict[str, Any]:
    """`validate --json` of the given stages (all implemented when none), as parsed JSON (and, given `html`, its
    `--html` report written there)."""
    args = ["validate", str(topology), "--json", *(["--only", ",".join(stages)] if stages else []),
            *(["--html", str(html)] if html is not None else [])]
    done = cli(*args, timeout_s=240)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def statuses(report: Mapping[str, Any]) -> dict[str, str]:
    """Stage name -> status."""
    return {s["name"]: s["status"] for s in report["stages"]}
