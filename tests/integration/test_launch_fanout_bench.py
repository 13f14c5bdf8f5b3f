"""bench/fanout.py runs end to end at a tiny size, SSH and Ray (the real measurement is `python bench/fanout.py`)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_fanout_bench_runs_and_cleans_up(root_only: None) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "fanout.py"), "--sizes", "1,2", "--ray-sizes", "2",
                          "--runs", "1"], capture_output=True, text=True, timeout=110, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ratio 2-host / 1-host connect+start:" in run.stdout
    assert "Ray on the same hosts" in run.stdout and "ratio Ray 2-host / 2-host connect+start:" in run.stdout
    assert "LEFTOVER" not in run.stdout
