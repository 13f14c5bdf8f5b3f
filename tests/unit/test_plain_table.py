"""planning/plain_table draws rich's SIMPLE_HEAD tables byte for byte as rich does: random tables at 20..220
columns, every shipped topology's plan and prediction at 80, 120 and 200, and rich itself where the subset ends."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console, Group

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.files import plan_path
from k3deploy.planning.perf_model import PerfUnknown
from k3deploy.planning.perf_report import prediction_renderable
from k3deploy.planning.plain_table import SimpleTable, Styled
from k3deploy.planning.prediction import predict_plan
from k3deploy.planning.report import plan_renderable
from k3deploy.planning.workload import parse_workload

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ("in=8192,out=1024,concurrency=16,effort=high", "in=1000,out=200,concurrency=256")


def draw(renderable: Any, width: int, **kw: Any) -> str:
    """What the CLI's console (cli/plan.py `_console`) prints, piped, at `width` columns."""
    opts: dict[str, Any] = {"highlight": False, "soft_wrap": False, "markup": False, "emoji": False,
                            "force_terminal": False, "legacy_windows": False, **kw}
    out = io.StringIO()
    Console(file=out, width=width, **opts).print(renderable)
    return out.getvalue()


def by_rich(r: Any) -> Any:
    """The same renderable with every table left to rich."""
    if isinstance(r, Group):
        return Group(*(by_rich(p) for p in r.renderables))
    return r.rich_table() if isinstance(r, SimpleTable) else r


def tables_in(r: Any) -> list[SimpleTable]:
    if isinstance(r, Group):
        return [t for p in r.renderables for t in tables_in(p)]
    return [r] if isinstance(r, SimpleTable) else []


CAT = load_catalog()
PLANS = [(path.name, plan_path(path, CAT).plan) for path in sorted((ROOT / "topologies").glob("*.yaml"))]


def predictions() -> list[tuple[str, Any]]:
    out = []
    for name, plan in PLANS:
        if plan is None or not plan.feasible:
            continue
        for load in WORKLOADS:
            try:
                out.append((f"{name} {load}", predict_plan(plan, CAT, parse_workload(load))))
            except PerfUnknown:
                continue
    return out


PREDICTIONS = predictions()


def test_every_shipped_topology_is_predicted() -> None:
    assert len(PREDICTIONS) >= 10, [name for name, _ in PREDICTIONS]


@pytest.mark.parametrize("width", [80, 120, 200])
@pytest.mark.parametrize("name, p", PREDICTIONS, ids=[n for n, _ in PREDICTIONS])
def test_prediction_drawn_here_is_rich_byte_for_byte(name: str, p: Any, width: int) -> None:
    t = prediction_renderable(p)
    tables = tables_in(t)
    assert len(tables) == 5
    for table in tables:  # each table takes the plain path here, and gives rich's lines
        lines = table.plain_lines(width)
        assert lines is not None, table.title
        assert "\n".join(lines) + "\n" == draw(table.rich_table(), width)
    assert draw(t, width) == draw(by_rich(t), width)


@pytest.mark.parametrize("width", [80, 120, 200])
@pytest.mark.parametrize("name, plan", PLANS, ids=[n for n, _ in PLANS])
def test_plan_drawn_here_is_rich_byte_for_byte(name: str, plan: Any, width: int) -> None:
    """`plan`'s memory budget (each role's in PD) takes the plain path and gives rich's bytes."""
    r = plan_renderable(plan)
    tables = tables_in(r)
    assert tables or plan.memory is None
    for table in tables:
        assert table.plain_lines(width) is not None, table.title
    assert draw(r, width) == draw(by_rich(r), width)


WORDS = st.text(alphabet="abcXY019,.()-/=+:[ \n", max_size=50)
CELLS = WORDS | st.builds(Styled, WORDS, st.sampled_from(["", "bold", "red"]))


@st.composite
def tables(draw_: Any) -> SimpleTable:
    n = draw_(st.integers(1, 4))
    columns = tuple((draw_(st.text(alphabet="abc xy", max_size=12)), draw_(st.sampled_from(["left", "right"])))
                    for _ in range(n))
    rows = draw_(st.lists(st.tuples(*[CELLS] * n), max_size=6))
    return SimpleTable(draw_(st.text(alphabet="abcXY01 ,;()", max_size=90)), columns, tuple(rows))


@settings(max_examples=400, deadline=None)
@given(table=tables(), width=st.integers(20, 220))
def test_random_tables_drawn_here_are_rich_byte_for_byte(table: SimpleTable, width: int) -> None:
    want = draw(table.rich_table(), width)
    lines = table.plain_lines(width)
    if lines is not None:
        assert "\n".join(lines) + "\n" == want
    assert draw(table, width) == want


def test_most_random_widths_take_the_plain_path() -> None:
    """The property above is no test if everything falls back: a wide, wrapping table at 20..220 columns."""
    t = SimpleTable("a title that wraps at twenty", (("term", "left"), ("ms", "right"), ("how", "left")),
                    (("decode step", "19.95", "batch 16 over a rather long explanation of the term"),
                     ("x", "1,151.76", "8,192 tokens: 1,151.8 ms per stage, and more words here")))
    drawn = [w for w in range(20, 221) if t.plain_lines(w) is not None]
    assert drawn == list(range(20, 221))


@pytest.mark.parametrize("kw, table", [
    ({}, SimpleTable("µs", (("a", "left"),), (("b",),))),  # not ASCII
    ({}, SimpleTable("t", (("a", "left"), ("b", "right")), (("x\ty", "z"),))),  # a tab
    ({"force_terminal": True, "color_system": "standard"}, SimpleTable("t", (("a", "left"),), ((Styled("y", "red"),),))),
    ({"markup": True}, SimpleTable("t", (("a", "left"),), (("[bold]x[/bold] y",),))),  # markup the console reads
    ({"emoji": True}, SimpleTable("t", (("a", "left"),), ((":smile: y",),))),
    ({"force_terminal": True, "color_system": "truecolor"}, SimpleTable("t", (("a", "left"),), (("y",),))),
])
def test_outside_the_subset_rich_draws_it(kw: dict[str, Any], table: SimpleTable) -> None:
    parts = Group(table, "after")
    assert draw(parts, 40, **kw) == draw(by_rich(parts), 40, **kw)


def test_a_table_too_narrow_for_its_padding_falls_back() -> None:
    t = SimpleTable("t", tuple((c, "left") for c in "abcdefghij"), (tuple("0123456789"),))
    assert t.plain_lines(20) is None
    assert draw(t, 20) == draw(t.rich_table(), 20)


def test_terminal_keeps_the_styles() -> None:
    p = PREDICTIONS[0][1]
    t = prediction_renderable(p)
    styled = draw(t, 120, force_terminal=True, color_system="standard")
    assert styled == draw(by_rich(t), 120, force_terminal=True, color_system="standard")
    assert "\x1b[2m" in styled  # the dim footer
