"""bench/cli_scale.py runs end to end at its smallest size, 4 hosts (the real measurement is `python bench/cli_scale.py`):
one size runs every line of the script (its ratios are then 1.00x); what scales with hosts is measured by the
script itself, and launch and stop across 4 hosts are tested by tests/integration/test_launch_ssh.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_cli_scale_bench_runs_and_cleans_up(root_only: None) -> None:
    # --settle-s 0: stop as soon as the supervisor says "supervising" (an event), so that every stop phase is in
    # its log; with -1 a stop can land before the supervisor logs anything (seen once on a loaded machine).
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "cli_scale.py"), "--sizes", "4", "--runs", "1",
                          "--settle-s", "0"], capture_output=True, text=True, timeout=580, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 / 4 hosts: launch" in run.stdout and "k3deploy's own CPU: launch" in run.stdout
    assert "nan" not in run.stdout  # every stop phase was found in the supervisor's log
    assert "LEFTOVER" not in run.stdout
