"""Golden files pin `k3deploy render` output for every topology in topologies/ and every format.

Regenerate with `K3_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_render_golden.py` and review the diff.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from k3deploy.engines.exports import export, stdout_text
from tests.unit.test_render_support import FORMATS, ROOT, TOPOLOGIES, plan_file

GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("K3_UPDATE_GOLDEN") == "1"


def rendered(path: Path, fmt: str) -> str:
    return stdout_text(export(plan_file(path), fmt))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_golden(path: Path, fmt: str) -> None:
    golden = GOLDEN / path.stem / f"{fmt}.txt"
    got = rendered(path, fmt)
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got, encoding="utf-8")
        return
    assert golden.exists(), f"no golden file {golden}: run with K3_UPDATE_GOLDEN=1 and review it"
    want = golden.read_text(encoding="utf-8")
    if got != want:
        lines = difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(golden), "rendered")
        diff = "".join(lines)
        pytest.fail(f"rendered output differs from {golden} (K3_UPDATE_GOLDEN=1 to accept):\n{diff}")


@pytest.mark.timeout(30)
def test_no_stale_golden_directories() -> None:
    stems = {p.stem for p in TOPOLOGIES}
    dirs = [d for d in GOLDEN.iterdir() if d.is_dir()] if GOLDEN.exists() else []
    stale = sorted(d.name for d in dirs if d.name not in stems)
    assert not stale, f"golden files for topologies that no longer exist: {stale}"
