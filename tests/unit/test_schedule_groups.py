"""tests/schedule.py's groups: every module that uses the run's Ray or Slurm cluster or README's venv (session
fixtures of tests/integration/conftest.py, one per xdist worker) is in that fixture's group, so it is built once a
run; other modules are groups of their own. (schedule.py reads a module's text for its marks, so this file
spells them in pieces.)"""
from __future__ import annotations

import re
from pathlib import Path

from tests import schedule

INTEGRATION = sorted((schedule.ROOT / "tests" / "integration").glob("test_*.py"))
# A test or fixture that takes the cluster's fixture, or builds a cluster of its own.
USES = {"ray-clusters": re.compile(r"\bray4\b|RayRig\("),
        "slurm-clusters": re.compile(r"\bslurm: SlurmRig\b|SlurmRig\("),
        "readme-venv": re.compile(r"\breadme_install\b")}


def module(path: Path) -> str:
    return str(path.relative_to(schedule.ROOT))


def test_every_module_using_a_cluster_is_in_its_group() -> None:
    using = 0
    for path in INTEGRATION:
        used = [group for group, pattern in USES.items() if pattern.search(path.read_text(encoding="utf-8"))]
        assert len(used) <= 1, (module(path), used)
        if used:
            using += 1
            assert schedule.group_of(module(path)) == used[0], module(path)
    assert using >= 10, using  # the Ray, Slurm and README-venv modules were found at all


def test_a_module_of_neither_is_its_own_group() -> None:
    mark = "mark." + "ray_cluster"
    marked = {p.name for p in INTEGRATION if mark in p.read_text(encoding="utf-8")}
    assert "test_validate_all_ray.py" in marked  # rig4 through its mark alone
    assert schedule.group_of("tests/integration/test_validate_all_ray.py") == "ray-clusters"
    for name in ("tests/integration/test_launch_ssh.py", "tests/unit/test_schedule_groups.py"):
        assert schedule.group_of(name) == name
