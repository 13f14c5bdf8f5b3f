"""Readable at 80 columns, and nothing lost when the output is piped into a CI log."""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from k3deploy.catalog.loader import load_catalog
from k3deploy.plan_report.report import plan_renderable, search_table
from k3deploy.planning.files import plan_path
from k3deploy.planning.search import search_shapes
from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "topologies" / "h100-4x8-sglang.yaml"


def at_80(renderable: object) -> list[str]:
    buf = io.StringIO()
    Console(file=buf, width=80, highlight=False, markup=False, emoji=False).print(renderable)
    return buf.getvalue().splitlines()


def squash(text: str) -> str:
    return " ".join(text.split())


def test_plan_headline_and_how_cells_fit_80_columns_without_splitting_a_phrase() -> None:
    plan = plan_path(H100, load_catalog()).plan
    assert plan is not None
    lines = at_80(plan_renderable(plan))
    assert max(len(ln) for ln in lines) <= 80
    for phrase in ("sglang TP32/EP32/DP1/PP1/DCP1 attn_tp=32 world=32 on 4 x 8 h100-80gb",
                   "(28 experts per EP rank)", "pool ratio 0.9000", "x 133,880 tokens", "14,042,880 B/slot",
                   "(1 - 0.85) x free before", "(CUDA context, NCCL),", "engine static memory",
                   "free after the pools", "(activations, CUDA graphs)", "vision tower", "(0.75 GiB less the"):
        assert any(phrase in ln for ln in lines), (phrase, "\n".join(lines))


def test_search_reasons_are_whole_at_80_columns() -> None:
    rows = search_shapes(load_catalog(), model_id="kimi-k3", hardware_id="h100-80gb", gpus=32, family="sglang")
    lines = at_80(search_table("h100-80gb", 32, "sglang", rows))
    assert max(len(ln) for ln in lines) <= 80
    reasons = {r.reason for r in rows if not r.feasible}
    assert reasons
    text = squash("\n".join(lines))
    for reason in reasons:
        assert squash(reason) in text, reason
    assert len(lines) < len(rows) + 10 + 3 * len(reasons)  # one line per shape, each reason said once


def test_error_locations_are_never_split() -> None:
    # A short folder: a location fits 80 columns only if its path does (an xdist worker's tmp_path, with its
    # popen-gwN part, pushed `path:line:col` plus the message's start past them).
    with tempfile.TemporaryDirectory(prefix="k3n-") as d:
        _check_locations(Path(d) / "bad.yaml")


def _check_locations(f: Path) -> None:
    f.write_text((ROOT / "tests" / "assets" / "invalid" / "five-mistakes.yaml").read_text())
    r = run_k3deploy("plan", f, timeout_s=50,  # piped: rich falls back to 80 columns
                     environ={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert r.returncode == 2
    result = plan_path(f, load_catalog())
    for issue in result.issues:
        assert any(issue.location(str(f)) in ln for ln in r.stdout.splitlines()), issue
        assert squash(issue.message) in squash(r.stdout)
