"""Shared test setup: the repo root on sys.path, a tiny checkpoint per test module, and the figures summary."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from k3deploy.checkpoint.manifest import Manifest


@pytest.fixture(scope="module")
def checkpoint_manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    """A kimi-k3-tiny checkpoint (the stand-in's, folder named as the model) and its manifest; one per test
    module, so a module that damages its copy harms no other."""
    from k3deploy.sim.checkpoint import write_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "kimi-k3-tiny"
    return path, write_checkpoint(path)


@pytest.fixture(scope="module")
def checkpoint(checkpoint_manifest: tuple[Path, Manifest]) -> Path:
    """The module's kimi-k3-tiny checkpoint folder."""
    return checkpoint_manifest[0]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the reliability figures the tests gathered (tests/figures.py), once, at the end of the run."""
    from tests.figures import summary_lines

    terminalreporter.section("k3deploy reliability figures")
    for line in summary_lines():
        terminalreporter.write_line(line)
