"""bench/sim_pacing.py runs end to end in its quick mode (the measurement itself is the script's output)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
def test_sim_pacing_bench_prints_every_figure() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sim_pacing.py"), "--quick", "--speed", "4"],
        capture_output=True,
        text=True,
        timeout=220,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for verdict in (
        "rising with prompt length:",
        "falling on a prefix hit:",
        "(within 10%:",
        "growing with concurrency:",
    ):
        assert verdict in out, out
    assert "tokens cached" in out and out.count("streams: mean ITL") == 2
