"""README's install command, verbatim, in a fresh venv made by a stock python3 with nothing preinstalled.

README's second command (`bash scripts/test.sh`) is proven by CI itself: `.ci/run` executes exactly it on a
fresh Debian machine, so running it again from inside the suite it starts would only recurse.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme_text import ROOT, two_commands

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist"}


def _stock_python() -> str:
    """The interpreter this venv was made from (not the venv's, which sees k3deploy already)."""
    base = getattr(sys, "_base_executable", sys.executable)
    return os.path.realpath(base)


def test_readme_install_command_works_in_a_fresh_venv(tmp_path: Path) -> None:
    install = two_commands()[0]
    clone = tmp_path / "k3deploy"
    shutil.copytree(ROOT, clone, ignore=lambda _d, names: [n for n in names
                                                            if n in SKIP_DIRS or n.endswith(".egg-info")])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(_stock_python())
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "COLUMNS")}
    env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    run = subprocess.run(["sh", "-c", install], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=560, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    venv_cfg = (clone / ".venv" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in venv_cfg
    first = run.stdout.splitlines()[0]
    assert first.startswith("topologies/h100-4x8-sglang.yaml: k3-h100-4x8 FEASIBLE"), run.stdout[:2000]
    assert "Successfully installed" not in run.stdout  # pip is quiet: the plan is what the user sees
