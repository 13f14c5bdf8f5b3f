"""`plan --search --workload --html`: the Pareto front of output tok/s per GPU against tok/s per user (1 / TPOT).

At one concurrency a faster shape is faster on both axes, so the front is traced as AIConfigurator traces it: every
shape that fits, each at a sweep of concurrencies (the asked one among them); a point is a (shape, concurrency)
pair, and the front joins those no other beats on both axes. The ranked shapes at the asked concurrency are marked,
and the ranking is the table below. Of a topology with roles (`plan FILE --search`), the points are its
prefill/decode layouts at the asked concurrency: there a layout trades one axis for the other (a prefill role
that bounds the rate, a decode that holds fewer requests), so the front is drawn at that concurrency alone."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from k3deploy.html_report import charts
from k3deploy.html_report.page import document, esc, figure, table
from k3deploy.planning.ranking import RankedShape, parallel_name, shape_name

if TYPE_CHECKING:
    from k3deploy.planning.perf_band import Band
    from k3deploy.planning.role_search import RoleLayout
    from k3deploy.planning.workload import Workload

MARKED = 5  # the ranking's first shapes are named on the chart
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # concurrencies each shape is predicted at for the front


class Point(NamedTuple):
    """One fitting shape on the chart."""

    rank: int  # 1 = the ranking's best (at the asked concurrency; 0 for a point of the sweep)
    name: str
    concurrency: int
    per_user: float  # output tok/s one request sees (1000 / TPOT ms)
    per_gpu: float  # output tok/s per GPU
    meets: bool  # meets --tpot-max


def points(rows: Sequence[RankedShape], concurrency: int, ranked: bool) -> list[Point]:
    """Every shape with a prediction, in ranking order (a sweep's: only those whose caches run the whole
    concurrency at once; a capped one repeats a lower concurrency's batch with a queue in front)."""
    out = []
    for i, r in enumerate(rows):
        p = r.prediction
        if p is not None and p.tpot_s > 0 and (ranked or p.capped_by is None):
            out.append(Point(i + 1 if ranked else 0, shape_name(r), concurrency, 1 / p.tpot_s,
                             p.output_throughput_per_gpu, r.meets_tpot))
    return out


def swept(rank_at: Callable[[int], Sequence[RankedShape]], asked: int) -> list[Point]:
    """The points of every other concurrency of the sweep (the asked one's are the ranking's)."""
    return [q for c in SWEEP if c != asked for q in points(rank_at(c), c, ranked=False)]


def pareto_front(pts: Sequence[Point]) -> list[Point]:
    """The shapes no other beats on both axes, by tok/s per user ascending (a shape on the front gives up per-GPU
    throughput only for faster tokens per user)."""
    front: list[Point] = []
    for q in sorted(pts, key=lambda q: (-q.per_user, -q.per_gpu)):
        if not front or q.per_gpu > front[-1].per_gpu:
            front.append(q)
    return sorted(front, key=lambda q: q.per_user)


def pareto_svg(pts: Sequence[Point], sweep: Sequence[Point], front: Sequence[Point], title: str,
               what: str = "shape") -> str:
    """The sweep's points in grey, the asked concurrency's shapes (or layouts: `what`) in colour, the front as a
    line, the first ranks labelled."""
    with charts.rc():
        fig = charts.new_figure(9.0, 5.4)
        ax = fig.add_subplot()
        ax.set_xscale("log")
        ax.set_yscale("log")
        if sweep:
            ax.scatter([q.per_user for q in sweep], [q.per_gpu for q in sweep], s=14, color="#b8b8b8",
                       label="a shape at another concurrency")
        ax.scatter([q.per_user for q in pts], [q.per_gpu for q in pts], s=26, color=charts.PALETTE[4],
                   label=f"a {what} at concurrency {pts[0].concurrency}")
        over = [q for q in pts if not q.meets]
        if over:
            ax.scatter([q.per_user for q in over], [q.per_gpu for q in over], s=60, facecolors="none",
                       edgecolors=charts.PALETTE[5], linewidths=1.2, label="over --tpot-max")
        ax.plot([q.per_user for q in front], [q.per_gpu for q in front], "-", color=charts.PALETTE[0],
                linewidth=1.6, label=f"Pareto front ({what} @ concurrency)")
        for q in front[:: max(1, len(front) // 6)]:
            ax.annotate(f"{q.name} @{q.concurrency}", (q.per_user, q.per_gpu), textcoords="offset points",
                        xytext=(-4, -12), fontsize=7, color=charts.PALETTE[0], ha="right")
        best = [q for q in pts if q.rank == min(p.rank for p in pts)] if pts else []
        if best:
            ax.scatter([best[0].per_user], [best[0].per_gpu], marker="*", s=220, color=charts.PALETTE[1],
                       edgecolors="#222222", linewidths=0.6, zorder=5, label=f"#1 {best[0].name}")
        others = sorted((q for q in pts if 1 < q.rank <= MARKED), key=lambda q: q.rank)
        if others:
            ax.scatter([q.per_user for q in others], [q.per_gpu for q in others], s=70, facecolors="none",
                       edgecolors="#222222", linewidths=1.0, zorder=4,
                       label="ranked " + ", ".join(f"#{q.rank} {q.name}" for q in others))
        if best:
            ax.annotate(f"#1 {best[0].name}", (best[0].per_user, best[0].per_gpu), textcoords="offset points",
                        xytext=(8, 6), fontsize=8.5, fontweight="bold")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("output tok/s per user (1 / TPOT, log scale)")
        ax.set_ylabel("output tok/s per GPU (log scale)")
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(True, color="#e4e4e4", linewidth=0.6)
        ax.legend(loc="best", frameon=False, fontsize=8)
    ranked = sorted(pts, key=lambda q: q.rank)[:MARKED]
    desc = (f"{len(pts)} {what}s that fit at concurrency {pts[0].concurrency} and {len(sweep)} points of the same "
            f"{what}s at other concurrencies, as output tokens per second per GPU against per user. The Pareto front, "
            "from slowest to fastest per user: "
            + "; ".join(f"{q.name} at concurrency {q.concurrency}: {q.per_gpu:,.1f} per GPU at {q.per_user:,.1f} per "
                        "user" for q in front)
            + ". Ranked first: " + "; ".join(f"#{q.rank} {q.name}" for q in ranked) + ".")
    return charts.svg(fig, "Pareto front: tok/s per GPU against tok/s per user", desc)


def _limits(objective: str, tpot_max_ms: float | None) -> str:
    return objective + (f", TPOT at most {tpot_max_ms:g} ms" if tpot_max_ms is not None else "")


def _drawn(pts: Sequence[Point], sweep: Sequence[Point], front: Sequence[Point], title: str, what: str,
           caption: str, swept: bool) -> list[str]:
    """The chart with its caption and the front as a table (`swept`: with each point's concurrency), or why there
    is nothing to draw."""
    if not pts:
        return [f"<p class=\"fail\">No {what} fits: there is nothing to draw.</p>"]
    head = (what, "concurrency") if swept else (what,)
    return [figure(pareto_svg(pts, sweep, front, title, what), caption),
            table("The Pareto front", (*head, "tok/s per user", "tok/s per GPU"),
                  [(q.name, *((q.concurrency,) if swept else ()), f"{q.per_user:,.1f}", f"{q.per_gpu:,.1f}")
                   for q in front], numeric=tuple(range(1, len(head) + 2)))]


def _band_note(band: Band | None, shared: str) -> str:
    """The band under the table, as a TPOT factor range, or nothing without one."""
    if band is None:
        return ""
    from k3deploy.plan_report.perf_report import band_line

    return f"<p>{esc(band_line(band))} (TPOT x {1 / (1 + band.rel):.2f}-{1 + band.rel:.2f}; {shared})</p>"


def search_page(hardware: str, gpus: int, engine: str, model: str, w: Workload, objective: str,
                tpot_max_ms: float | None, rows: Sequence[RankedShape], why: str,
                rank_at: Callable[[int], Sequence[RankedShape]]) -> str:
    """The whole page; `rank_at(c)` ranks the same search at concurrency c (for the front's sweep)."""
    pts = points(rows, w.concurrency, ranked=True)
    sweep = swept(rank_at, w.concurrency) if pts else []
    front = pareto_front([*pts, *sweep])
    on_front = {q.rank for q in front if q.rank}
    title = (f"{gpus} x {hardware} with {engine}, {w.input_tokens:,} in / {w.output_tokens:,} out, concurrency "
             f"{w.concurrency}")
    body = [f"<p><strong>{esc(why)}</strong></p>",
            *_drawn(pts, sweep, front, title, "shape",
                    f"Each dot is a shape that fits at one concurrency (coloured: {w.concurrency}, as asked; grey: "
                    f"{', '.join(str(c) for c in SWEEP if c != w.concurrency)}, where its caches run them all at "
                    f"once); the line joins the {len(front)} points no other beats on both axes; the star is the "
                    f"ranking's first ({_limits(objective, tpot_max_ms)}).", swept=True)]
    table_rows = []
    for i, r in enumerate(rows):
        p = r.prediction
        if p is None:
            table_rows.append((i + 1, shape_name(r), "-", "-", "-", "-", "", f"does not fit: {r.reason}"))
            continue
        table_rows.append((i + 1, shape_name(r), f"{p.ttft_s * 1000:,.0f}", f"{p.tpot_s * 1000:,.2f}",
                           f"{1 / p.tpot_s:,.1f}", f"{p.output_throughput_per_gpu:,.1f}",
                           "yes" if i + 1 in on_front else "",
                           p.bound("tpot", short=True) if r.meets_tpot else r.reason))
    body.append(table(f"Shapes ranked by {objective}", ("rank", "shape", "TTFT ms", "TPOT ms", "tok/s per user",
                                                        "tok/s per GPU", f"on the front at {w.concurrency}", "bound"),
                      table_rows, numeric=(0, 2, 3, 4, 5)))
    body.append(_band_note(next((r.prediction.band for r in rows if r.prediction is not None), None),
                           "every shape here shares it"))
    return document(f"k3deploy plan --search: {model} on {title}",
                    f"ranked by {objective}; the Pareto front of output tok/s per GPU against tok/s per user",
                    "".join(body))


def layout_label(r: RoleLayout) -> str:
    """`TP8/PP2 | TP16/DCP16`: the prefill shape, then the decode shape."""
    return f"{parallel_name(r.prefill)} | {parallel_name(r.decode)}"


def layouts_page(file: str, gpus: dict[str, int], hardware: str, w: Workload, objective: str,
                 tpot_max_ms: float | None, rows: Sequence[RoleLayout], why: str) -> str:
    """The page of a topology with roles: its layouts' Pareto front at the asked concurrency, and the ranking."""
    pts = [Point(i + 1, layout_label(r), w.concurrency, 1 / r.prediction.tpot_s,
                 r.prediction.output_throughput_per_gpu, r.meets_tpot)
           for i, r in enumerate(rows) if r.prediction is not None and r.prediction.tpot_s > 0]
    front = pareto_front(pts)
    on_front = {q.rank for q in front}
    title = (f"{file}: {gpus['prefill']} prefill + {gpus['decode']} decode x {hardware}, {w.input_tokens:,} in / "
             f"{w.output_tokens:,} out, concurrency {w.concurrency}")
    body = [f"<p><strong>{esc(why)}</strong></p>",
            *_drawn(pts, [], front, title, "layout",
                    "Each dot is a prefill | decode layout that fits, at the asked concurrency; the line joins the "
                    f"{len(front)} no other beats on both axes; the star is the ranking's first "
                    f"({_limits(objective, tpot_max_ms)}). Output tok/s per GPU counts both roles' GPUs.",
                    swept=False)]
    table_rows = []
    for i, r in enumerate(rows):
        p = r.prediction
        if p is None:
            table_rows.append((i + 1, parallel_name(r.prefill), parallel_name(r.decode), "-", "-", "-", "-", "",
                               f"does not fit: {r.reason}" if not r.feasible else f"not timed: {r.reason}"))
            continue
        table_rows.append((i + 1, parallel_name(r.prefill), parallel_name(r.decode),
                           f"{p.ttft_s * 1000:,.0f}" if p.ttft_s is not None else "-", f"{p.tpot_s * 1000:,.2f}",
                           f"{1 / p.tpot_s:,.1f}", f"{p.output_throughput_per_gpu:,.1f}",
                           "yes" if i + 1 in on_front else "",
                           p.bound("output_throughput") if r.meets_tpot else r.reason))
    body.append(table(f"Layouts ranked by {objective}", ("rank", "prefill", "decode", "TTFT ms", "TPOT ms",
                                                         "tok/s per user", "tok/s per GPU", "on the front", "bound"),
                      table_rows, numeric=(0, 3, 4, 5, 6)))
    body.append(_band_note(next((r.prediction.band for r in rows if r.prediction is not None), None),
                           "the decode role's, every layout here shares it"))
    return document(f"k3deploy plan --search: {file}", f"prefill/decode layouts ranked by {objective}; the Pareto "
                    "front of output tok/s per GPU against tok/s per user", "".join(body))
