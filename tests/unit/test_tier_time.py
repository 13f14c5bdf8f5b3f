"""The real-engine tier's time in the run's summary (tests/realengine/tier_time.py): only the tests that start
real vLLM count, every phase of theirs, and the install when scripts/test.sh timed it."""
from __future__ import annotations

import pytest

from tests.realengine import tier_time


def _report(nodeid: str, when: str, duration: float, outcome: str = "passed") -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("f.py", 0, nodeid), {}, outcome, None, when, duration=duration)


class _Item:
    def __init__(self, nodeid: str, fixturenames: list[str]) -> None:
        self.nodeid, self.fixturenames = nodeid, fixturenames


def test_the_tier_sums_its_starters_phases_and_adds_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_time, "STARTERS", set())
    monkeypatch.setattr(tier_time, "SPENT_S", {})
    monkeypatch.setenv("K3DEPLOY_VLLM_INSTALL_S", "120")
    monkeypatch.delenv("K3DEPLOY_REAL_TIER_RUN", raising=False)
    tier_time.note_items([_Item("a", ["tmp_path", "vllm_cache_root"]), _Item("b", ["tmp_path"])])  # type: ignore[list-item]
    for r in (_report("a", "setup", 50.0), _report("a", "call", 20.0), _report("a", "teardown", 5.0),
              _report("b", "call", 1000.0)):
        tier_time.note_report(r)
    assert tier_time.summary_lines() == [
        "real-engine tier: 1 tests starting real vLLM took 75 s",
        "real-engine tier: venv install 120 s; tier total 195 s (3.2 min)"]


def test_no_line_without_a_starter_and_no_install_line_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_time, "STARTERS", {"a"})
    monkeypatch.setattr(tier_time, "SPENT_S", {})
    monkeypatch.delenv("K3DEPLOY_VLLM_INSTALL_S", raising=False)
    monkeypatch.delenv("K3DEPLOY_REAL_TIER_RUN", raising=False)
    assert tier_time.summary_lines() == []
    tier_time.note_report(_report("a", "setup", 3.0, outcome="skipped"))  # the tier off: a skip is no cost
    assert tier_time.summary_lines() == []
    tier_time.note_report(_report("a", "call", 4.0))
    assert tier_time.summary_lines() == ["real-engine tier: 1 tests starting real vLLM took 4 s"]


def test_one_of_the_two_runs_names_itself_and_leaves_the_install_to_the_script(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_time, "STARTERS", {"a"})
    monkeypatch.setattr(tier_time, "SPENT_S", {})
    monkeypatch.setenv("K3DEPLOY_VLLM_INSTALL_S", "120")
    monkeypatch.setenv("K3DEPLOY_REAL_TIER_RUN", "2")
    tier_time.note_report(_report("a", "call", 40.0))
    assert tier_time.summary_lines() == ["real-engine tier, run 2: 1 tests starting real vLLM took 40 s"]
