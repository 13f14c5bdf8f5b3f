"""The order of a run and how its tests are shared between xdist workers (scripts/test.sh runs the main tier as
`-n 3 --no-loadscope-reorder`, with `scheduler` below): every module is one group (its module-scoped fixtures, a rig or
a deployment, are made once, on one worker; the modules that use a Ray cluster are one group together, and those that use a Slurm cluster another), and
groups go out longest first, as measured
(tests/durations.json, written by scripts/test_durations.py from a run's JUnit XML), so the workers end
together instead of one waiting on the last long module. A module the file does not know counts as a typical
one of its tier."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
# Seconds for a module the file does not name yet (a new one): the median of its tier in the last measured run.
UNKNOWN_S = {"integration": 40.0, "realengine": 120.0, "unit": 5.0}


def module_of(item: pytest.Item) -> str:
    """The test's module as a path from the repo root: `tests/unit/test_plan_cli.py`."""
    return item.nodeid.split("::", 1)[0]


def measured() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("modules", {}).items()}


def weight(module: str, known: dict[str, float]) -> float:
    if module in known:
        return known[module]
    tier = module.split("/")[1] if module.count("/") >= 2 else "unit"
    return UNKNOWN_S.get(tier, UNKNOWN_S["unit"])


# Modules that use the run's Ray cluster (marked ray_cluster: tests/integration/conftest.py) or start one of
# their own run on one worker, one after another: the session-scoped cluster is then built once a run (a
# session fixture is per xdist worker), and two clusters starting at once on 2 cores can miss Ray's own 30 s
# start-up timeout ("The current node timed out during startup"). The same for the Slurm cluster, and for the
# modules that use the venv README's install command makes (the session fixture `readme_install`: one pip
# install a run).
GROUPS = {"ray-clusters": ("mark.ray_cluster", "RayRig("), "slurm-clusters": ("mark.slurm_cluster", "SlurmRig("),
          "readme-venv": ("readme_install: ReadmeInstall",)}
ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def group_of(module: str) -> str:
    try:
        text = (ROOT / module).read_text(encoding="utf-8")
    except OSError:
        return module
    for group, markers in GROUPS.items():
        if any(m in text for m in markers):
            return group
    return module


def order(items: list[pytest.Item]) -> None:
    """Longest groups first (a group: a module, or every module that starts a Ray cluster; stable within a
    module); the scheduler below keeps each group on one worker."""
    known = measured()
    groups = {m: group_of(m) for m in {module_of(item) for item in items}}
    group_s: dict[str, float] = {}
    for module, group in groups.items():
        group_s[group] = group_s.get(group, 0.0) + weight(module, known)
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-group_s[groups[module_of(item)]], groups[module_of(item)], module_of(item),
                                 position[id(item)]))


def scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with our groups as its scopes (tests/conftest.py returns it from
    pytest_xdist_make_scheduler): xdist's own `--dist loadgroup` reads `xdist_group` marks through a node-id
    suffix that pytest 9 no longer lets it set, and sent a module's tests to both workers."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid.split("::", 1)[0])

    return GroupScheduling(config, log)
