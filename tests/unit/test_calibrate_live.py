"""`calibrate` end to end on a stand-in deployment paced at half the speed its topology tells the planner
(K3SIM_SPEED=0.5 in the launched processes' environment only): validate's effort stage at one concurrency and
length, `calibrate`, then `plan --workload` at a second concurrency and prompt length lands within 10% of what
the effort stage measures there (TTFT, TPOT and output tok/s), where the catalog's prediction was off by about
2x. Both runs' prompts are long enough that their TTFT is judged (validate/predicted.JUDGED_TTFT_MS), so both
factors are fitted; the prefill factor comes out a little above 2 (host-side costs per request, HTTP and
tokenizing, which K3SIM_SPEED does not scale). Measured (this test, 2026-12-04): at 2 x 2,057 / 210 tokens, TTFT -52% -> +3%, TPOT
-48% -> -0%, output tok/s +98% -> -1%."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.validate.nodes import fleet_runner
from k3deploy.validate.run import resolve_target, validate
from tests.k3deploy_cli import run_k3deploy
from tests.ports import free_port
from tests.unit.test_launch_support import kill_tagged

# The stand-in's nodes rendezvous over Gloo: torch (skipped in the 3.10 run).
pytestmark = [pytest.mark.timeout(180), pytest.mark.torch]
FIGURES = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")


def topology(name: str, tmp: Path, checkpoint: Path, ports: tuple[int, int], concurrency: int, prompt: int,
             out: int) -> dict[str, Any]:
    return {"name": name, "model": {"id": "kimi-k3-tiny", "path": str(checkpoint)},
            "hardware": {"gpu": "sim", "gpus_per_node": 1},
            "nodes": [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(2)],
            "engine": {"kind": "sim", "mimic": "sglang", "port": ports[0]},
            "parallel": {"tp": 2, "ep": 2},
            "serving": {"context_length": 32768, "max_running_requests": 8, "reasoning_effort": "max"},
            "launch": {"executor": "local", "port": ports[1], "dist_timeout_s": 30, "ready_timeout_s": 60,
                       "stop_grace_s": 2, "log_dir": str(tmp / "logs"), "state_dir": str(tmp / "state")},
            "validate": {"concurrency": concurrency, "effort_prompt_tokens": prompt, "effort_max_tokens": out,
                         "effort_requests": 2 * concurrency, "min_share_of_prediction": 0,
                         "cache_block_tokens": 128}}


def effort(path: Path) -> dict[str, Any]:
    """The effort stage's cold run: what it measured and what the catalog predicted for it."""
    report = validate(resolve_target(str(path)), fleet_runner, only=["effort"])
    stage = next(s for s in report.stages if s.name == "effort")
    assert "workload" in stage.results.get("predicted", {}), stage.model_dump_json(indent=1)
    return stage.results


def errors(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    return {k: predicted[k] / measured[k] - 1 for k in FIGURES}


def test_calibrate_brings_a_second_concurrency_and_length_within_ten_percent(tmp_path: Path,
                                                                            checkpoint: Path) -> None:
    name = f"ut-calibrate-{os.getpid() % 10000}"
    path, ports = tmp_path / f"{name}.yaml", (free_port(), free_port())
    path.write_text(yaml.safe_dump(topology(name, tmp_path, checkpoint, ports, 4, 1024, 512), sort_keys=False))
    state = str(tmp_path / "state")
    try:
        run = run_k3deploy("launch", str(path), "--skip-preflight", timeout_s=100, env={"K3SIM_SPEED": "0.5"})
        assert run.returncode == 0, run.stderr[-2000:]
        refused = run_k3deploy("calibrate", name, "--state-dir", state)
        assert refused.returncode == 5 and f"run `k3deploy validate {name} --only effort` first" in refused.stderr
        effort(path)
        fitted = run_k3deploy("calibrate", str(path), "--json")
        assert fitted.returncode == 0, fitted.stderr
        doc = json.loads(fitted.stdout)
        cal = doc["calibration"]
        assert cal["decode_factor"] == pytest.approx(2, rel=0.15)  # the stand-in runs at half speed
        assert 1.8 < cal["prefill_factor"] < 2.6  # half speed, and the host-side costs
        # A second concurrency and length, measured by the effort stage again.
        path.write_text(yaml.safe_dump(topology(name, tmp_path, checkpoint, ports, 2, 2048, 512), sort_keys=False))
        second = effort(path)
        w = second["predicted"]["workload"]
        spec = (f"in={w['input_tokens']},out={w['output_tokens']},concurrency={w['concurrency']},"
                f"prompts={w['num_prompts']}")
        planned = run_k3deploy("plan", str(path), "--workload", spec, "--json")
        assert planned.returncode == 0, planned.stderr
        prediction = json.loads(planned.stdout)["prediction"]
        measured = {k: second["cold"][k] for k in FIGURES}
        before, after = errors(second["predicted"], measured), errors(prediction, measured)
        assert prediction["calibration"]["deployment"] == name
        assert prediction["band"]["why"].startswith(f"calibrated on this cluster ({name}): 1 point")
        for k in FIGURES:
            assert abs(after[k]) < 0.10 < abs(before[k]), (k, before, after)
        shown = run_k3deploy("calibrate", name, "--state-dir", state, "--show", "--json")
        assert json.loads(shown.stdout)["calibration"] == doc["calibration"]
        removed = run_k3deploy("calibrate", name, "--state-dir", state, "--remove")
        assert removed.returncode == 0 and "calibration removed" in removed.stdout
        again = json.loads(run_k3deploy("plan", str(path), "--workload", spec, "--json").stdout)["prediction"]
        assert "calibration" not in again and again["band"]["kind"] == "derived"
    finally:
        run_k3deploy("stop", name, "--state-dir", state)
        assert kill_tagged(f"{name}.") == [], "processes left running"
