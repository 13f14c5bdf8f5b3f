"""The real-engine tier's cost in a run, for CI's log (issue 25: at most about 10 minutes, installs included):
the setup, call and teardown time of every test that starts real vLLM (they take the vllm_cache_root fixture,
tests/conftest.py), plus the venv install scripts/test.sh timed (K3DEPLOY_VLLM_INSTALL_S). In one of
scripts/real_tier.sh's two runs at once (K3DEPLOY_REAL_TIER_RUN names it) the line names the run and leaves
the install out: that script prints the tier's wall time and the install's wait once, for both."""
from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

FIXTURE = "vllm_cache_root"
STARTERS: set[str] = set()
SPENT_S: dict[str, float] = {}


def note_items(items: Iterable[pytest.Item]) -> None:
    """Remember which collected tests start real vLLM."""
    STARTERS.update(i.nodeid for i in items if FIXTURE in getattr(i, "fixturenames", ()))


def note_report(report: pytest.TestReport) -> None:
    """Add one phase's time (module fixtures' setup lands on the module's first test)."""
    if report.nodeid in STARTERS and not report.skipped:
        SPENT_S[report.nodeid] = SPENT_S.get(report.nodeid, 0.0) + report.duration


def summary_lines() -> list[str]:
    """The tier's total, its tests' count, and the install when scripts/test.sh timed it; nothing when no
    test of the tier ran."""
    if not SPENT_S:
        return []
    tests_s = sum(SPENT_S.values())
    run = os.environ.get("K3DEPLOY_REAL_TIER_RUN", "")
    if run:
        return [f"real-engine tier, run {run}: {len(SPENT_S)} tests starting real vLLM took {tests_s:.0f} s"]
    install = os.environ.get("K3DEPLOY_VLLM_INSTALL_S", "")
    install_s = float(install) if install.replace(".", "", 1).isdigit() else None
    lines = [f"real-engine tier: {len(SPENT_S)} tests starting real vLLM took {tests_s:.0f} s"]
    if install_s is not None:
        lines.append(f"real-engine tier: venv install {install_s:.0f} s; tier total {tests_s + install_s:.0f} s "
                     f"({(tests_s + install_s) / 60:.1f} min)")
    return lines
