"""bench/plan_startup.py and its floor program run end to end (the real measurement is the script itself)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "topologies" / "h100-4x8-sglang.yaml"


@pytest.mark.parametrize("parser", [[], ["--typer"]])
def test_floor_program_validates_and_prints_the_topology_name(parser: list[str]) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "plan_floor.py"), *parser, str(TOPOLOGY)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert "k3-h100-4x8" in run.stdout


@pytest.mark.timeout(200)
def test_plan_startup_bench_reports_every_ratio() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "plan_startup.py"), "--runs", "1"],
                         capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stderr
    assert "ratio plan / baseline:" in run.stdout and "floor / baseline:" in run.stdout
    assert "ratio plan --workload / baseline:" in run.stdout
    assert "ratio plan / typer floor:" in run.stdout and "(target <= 1.25x)" in run.stdout
    assert "(the same for every row)" in run.stdout
    assert run.stdout.count("median") == 5 and run.stdout.count(" cpu ") == 5
    assert run.stdout.count("paired, per round: ") == 2, run.stdout
    assert "cpu ratio plan / typer floor:" in run.stdout
