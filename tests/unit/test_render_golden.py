"""Golden files pin `k3deploy render` output for every topology in topologies/ and every format.

Regenerate with `K3_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_render_golden.py` and review the diff.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.engines.exports import stdout_text
from k3deploy.planning.rendering import render_files
from tests.unit.test_render_support import FORMATS, ROOT, TOPOLOGIES, compare_golden, plan_file

GOLDEN = ROOT / "tests" / "golden"


def rendered(path: Path, fmt: str) -> str:
    return stdout_text(render_files(plan_file(path), fmt))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_golden(path: Path, fmt: str) -> None:
    compare_golden(GOLDEN / path.stem / f"{fmt}.txt", rendered(path, fmt))


@pytest.mark.timeout(30)
def test_no_stale_golden_directories() -> None:
    stems = {p.stem for p in TOPOLOGIES} | {"launchers"}  # launchers/: test_render_launchers.py
    dirs = [d for d in GOLDEN.iterdir() if d.is_dir()] if GOLDEN.exists() else []
    stale = sorted(d.name for d in dirs if d.name not in stems)
    assert not stale, f"golden files for topologies that no longer exist: {stale}"
