"""Shared test setup: the repo root on sys.path and paths to real files."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the reliability figures the tests gathered (tests/figures.py), once, at the end of the run."""
    from tests.figures import summary_lines

    terminalreporter.section("k3deploy reliability figures")
    for line in summary_lines():
        terminalreporter.write_line(line)
