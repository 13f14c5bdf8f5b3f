"""The package type-checks (mypy with the pydantic plugin) and the tree passes ruff, as the style asks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_mypy_is_clean() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy", "k3deploy"], capture_output=True, text=True, cwd=ROOT,
                         timeout=230, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_is_clean() -> None:
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "k3deploy", "tests", "bench"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
