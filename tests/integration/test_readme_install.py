"""README's install command, verbatim, in a fresh venv made by a stock python3 with nothing preinstalled
(the `readme_install` fixture of tests/integration/conftest.py, whose venv test_core_install.py uses too).

README's second command (`bash scripts/test.sh`) is proven by CI itself: `.ci/run` executes exactly it on a
fresh Debian machine, so running it again from inside the suite it starts would only recurse.
"""
from __future__ import annotations

import pytest

from tests.readme_text import ReadmeInstall

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_readme_install_command_works_in_a_fresh_venv(readme_install: ReadmeInstall) -> None:
    run = readme_install.run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    venv_cfg = (readme_install.venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in venv_cfg
    first = run.stdout.splitlines()[0]
    assert first.startswith("topologies/h100-4x8-sglang.yaml: k3-h100-4x8 FEASIBLE"), run.stdout[:2000]
    assert "Successfully installed" not in run.stdout  # pip is quiet: the plan is what the user sees
