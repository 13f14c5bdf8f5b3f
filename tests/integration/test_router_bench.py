"""bench/router.py runs end to end in its quick mode against both real routers (the measurement itself is the
script's output)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("K3DEPLOY_ROUTERS_VENV") or Path.home() / ".cache" / "k3deploy" / "routers")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not (VENV / ".k3deploy-routers-ready").is_file(),
    reason=f"no routers venv at {VENV} (scripts/test.sh makes it with scripts/routers_venv.sh)")]


@pytest.mark.timeout(480)
def test_router_bench_prints_both_ways_and_the_overhead() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "router.py"), "--quick"], capture_output=True,
                         text=True, timeout=450, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    for kind in ("smg", "vllm-router"):
        line = next((s for s in run.stdout.splitlines() if s.startswith(f"{kind} (")), "")
        assert "TTFT straight" in line and "through the router" in line and "tok/s" in line, run.stdout
        assert f"{kind} overhead: " in run.stdout and " ms TTFT per request" in run.stdout
