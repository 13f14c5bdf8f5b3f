"""The reliability figures count what the tests report: faults injected, and what a rig teardown found
still running (tests/integration/sim_deployments.py's cleanup, shared by the SSH and Ray launch tests)."""
from __future__ import annotations

from pathlib import Path

from tests import figures
from tests.integration.sim_deployments import SimDeployments


class Leftovers(SimDeployments):
    """A rig teardown that finds what it is given, and records what it was asked to remove."""

    def __init__(self, tmp: Path, left: dict[str, list[str]]) -> None:
        super().__init__(None, tmp / "ckpt", tmp, {"executor": "ssh"})  # type: ignore[arg-type]
        self.left, self.removed = left, {}

    def left_on_hosts(self) -> dict[str, list[str]]:
        return self.left

    def remove(self, left: dict[str, list[str]]) -> None:
        self.removed = left


def test_a_teardown_counts_and_removes_what_was_left_running(tmp_path: Path) -> None:
    before = figures.FIGURES[figures.NODES_LEFT]
    d = Leftovers(tmp_path, {"h01": [], "h03": ["21", "22"]})
    assert d.cleanup() == ["processes left on hosts: {'h01': [], 'h03': ['21', '22']}"]
    assert figures.FIGURES[figures.NODES_LEFT] == before + 2 and d.removed == d.left
    figures.FIGURES[figures.NODES_LEFT] = before  # a planted leftover, not one the suite left


def test_a_clean_teardown_counts_nothing(tmp_path: Path) -> None:
    before = dict(figures.FIGURES)
    d = Leftovers(tmp_path, {"h01": [], "h02": []})
    assert d.cleanup() == [] and d.removed == {}
    figures.fault_injected()
    assert figures.FIGURES[figures.FAULTS_INJECTED] == before.get(figures.FAULTS_INJECTED, 0) + 1
    assert figures.FIGURES[figures.NODES_LEFT] == before.get(figures.NODES_LEFT, 0)
    figures.FIGURES[figures.FAULTS_INJECTED] -= 1
