"""The import contracts in pyproject ([tool.importlinter]) fail on a back import: lint-imports run against a copy
of the package with one import injected (hermetic: the copy is what gets analysed, never the checkout)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"

pytestmark = pytest.mark.timeout(300)


def lint(tmp: Path, inject: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports over a copy of k3deploy (Python files only) with `inject` {module path: line} appended."""
    copy = tmp / "src"
    shutil.copytree(ROOT / "k3deploy", copy / "k3deploy",
                    ignore=lambda d, names: [n for n in names if not (n.endswith(".py") or (Path(d) / n).is_dir())
                                             or n == "__pycache__"])
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    for rel, line in (inject or {}).items():
        with (copy / rel).open("a", encoding="utf-8") as f:
            f.write(f"\n{line}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=240, check=False)


def test_the_package_keeps_every_contract(tmp_path: Path) -> None:
    done = lint(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers(tmp_path: Path) -> None:
    done = lint(tmp_path, {"k3deploy/catalog/cache.py": "import k3deploy.records.store"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "layers: a lower layer never imports a higher one BROKEN" in done.stdout
    assert "k3deploy.catalog.cache -> k3deploy.records.store" in done.stdout


def test_the_stand_in_reaching_the_planner_through_another_module_breaks_its_contract(tmp_path: Path) -> None:
    # sim imports engines (allowed); engines then imports the planner: sim reaches it indirectly.
    done = lint(tmp_path, {"k3deploy/engines/kinds.py": "import k3deploy.planning.arith"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the stand-in engine never imports the planner, however indirectly BROKEN" in done.stdout
    chain = done.stdout.split("the stand-in engine never imports the planner, however indirectly\n", 1)[-1]
    assert "k3deploy.engines.kinds -> k3deploy.planning.arith" in chain
    assert "k3deploy.sim." in chain


def test_probes_import_nothing_of_k3deploy(tmp_path: Path) -> None:
    done = lint(tmp_path, {"k3deploy/probes/load.py": "import k3deploy.errors"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "k3deploy.probes.load -> k3deploy.errors" in done.stdout
