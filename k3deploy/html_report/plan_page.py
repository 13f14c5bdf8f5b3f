"""`plan --html`: each file's per-GPU memory budget drawn as the stack it is, against usable memory, and the
workload's prediction with its band."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from k3deploy.diagnostics import Issue
from k3deploy.html_report import charts
from k3deploy.html_report.page import document, esc, figure, table
from k3deploy.plan_report.report_tables import budget_rows
from k3deploy.planning.arith import GIB

if TYPE_CHECKING:
    from k3deploy.planning.files import FileResult
    from k3deploy.planning.pd_prediction import RolePrediction
    from k3deploy.planning.plan_model import Plan
    from k3deploy.planning.prediction import Prediction


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f}"


def budget_svg(plan: Plan, role: str = "") -> str:
    """One horizontal bar of the per-GPU budget, a segment per line item, and where usable memory ends."""
    m = plan.memory
    assert m is not None
    rows = budget_rows(plan)
    hw = plan.hardware.name if plan.hardware else ""
    with charts.rc():
        fig = charts.new_figure(9.0, 2.8)
        ax = fig.add_subplot()
        left = 0.0
        for i, (name, n, _how) in enumerate(rows):
            width = max(n, 0) / GIB
            ax.barh([0], [width], left=left, height=0.55, color=charts.PALETTE[i % len(charts.PALETTE)],
                    edgecolor="white", linewidth=0.8, label=f"{name}: {n / GIB:,.2f} GiB")
            if width > 0.06 * m.usable_bytes / GIB:  # wide enough to carry its own figure
                ax.text(left + width / 2, 0, f"{width:,.1f}", ha="center", va="center", color="white",
                        fontsize=8.5, fontweight="bold")
            left += width
        usable = m.usable_bytes / GIB
        ax.axvline(usable, color="#222222", linestyle="--", linewidth=1.2)
        ax.text(usable, 0.42, f" usable {usable:,.2f} GiB", ha="right" if left <= usable * 1.02 else "left",
                va="bottom", fontsize=8.5)
        ax.set_xlim(0, max(left, usable) * 1.04)
        ax.set_ylim(-0.5, 0.75)
        ax.set_yticks([])
        ax.set_xlabel("GiB per GPU")
        ax.set_title(f"{role}Per-GPU memory budget ({hw})", loc="left", fontsize=10)
        fig.legend(loc="outside lower center", ncol=3, frameon=False, fontsize=8)
        over = sum(max(n, 0) for _, n, _ in rows) - m.usable_bytes
        desc = (f"A stacked bar of {len(rows)} line items per GPU: "
                + "; ".join(f"{name} {n / GIB:,.2f} GiB" for name, n, _ in rows)
                + f". Usable memory {usable:,.2f} GiB" + (f"; the items exceed it by {over / GIB:,.2f} GiB."
                                                          if over > 0 else "."))
        return charts.svg(fig, f"{role}per-GPU memory budget", desc)


def budget_html(plan: Plan, role: str = "") -> str:
    """The budget's chart and its table (every line item, bytes and GiB), the lines summing to usable memory."""
    m = plan.memory
    assert m is not None
    rows = [(name, _gib(n), f"{n:,}", " ".join(how)) for name, n, how in budget_rows(plan)]
    rows.append(("usable", _gib(m.usable_bytes), f"{m.usable_bytes:,}", "the line items sum to this"))
    hw = plan.hardware.name if plan.hardware else ""
    return (figure(budget_svg(plan, role), "Each segment is one line item of the budget below; the dashed line is "
                   "the memory a GPU can use.")
            + table(f"{role}Per-GPU memory ({hw})", ("line item", "GiB", "bytes", "how"), rows, numeric=(1, 2)))


def capacity_html(plan: Plan, role: str = "") -> str:
    """KV tokens, concurrency and the context at that concurrency."""
    c = plan.capacity
    assert c is not None
    return table(f"{role}Capacity", ("quantity", "value"), (
        ("KV tokens in the pool", f"{c.kv_tokens:,}"), ("max concurrent requests", f"{c.max_running_requests:,}"),
        ("longest context at that concurrency", f"{c.max_context_tokens:,}")), numeric=(1,))


def prediction_svg(p: Prediction | RolePrediction) -> str:
    """TTFT and TPOT as stacks of their terms, TPOT with its band (a TTFT that leaves out an untimed transfer says
    so)."""
    untimed = p.ttft_s is None
    rows = (("TTFT" + (" less the transfer" if untimed else ""), p.ttft_terms, sum(t.seconds for t in p.ttft_terms)),
            ("TPOT", p.tpot_terms, p.tpot_s))
    with charts.rc():
        fig = charts.new_figure(9.0, 2.9)
        axes = fig.subplots(2, 1)
        for ax, (label, terms, total) in zip(axes, rows):
            left = 0.0
            for i, t in enumerate(terms):
                ms = t.seconds * 1000
                ax.barh([0], [ms], left=left, height=0.5, color=charts.PALETTE[i % len(charts.PALETTE)],
                        label=f"{t.name}: {ms:,.2f} ms")
                left += ms
            high = total * 1000
            if label == "TPOT" and p.band is not None:
                lo, hi = p.band.low(total) * 1000, p.band.high(total) * 1000
                ax.errorbar([total * 1000], [0], xerr=[[total * 1000 - lo], [hi - total * 1000]], fmt="none",
                            ecolor="#222222", capsize=6, linewidth=1.4)
                ax.text(hi, 0.3, f" band {p.band.label()}: {lo:,.2f}-{hi:,.2f} ms", fontsize=8, va="bottom",
                        ha="right")
                high = hi
            ax.set_xlim(0, high * 1.08 if high > 0 else 1)
            ax.set_yticks([0], [f"{label}\n{total * 1000:,.2f} ms"])
            ax.set_ylim(-0.5, 0.8)
            ax.set_xlabel("ms")
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)
        w = p.workload
        axes[0].set_title(f"Predicted for {w.input_tokens:,} in / {w.output_tokens:,} out at concurrency "
                          f"{w.concurrency}", loc="left", fontsize=10)
    band = (f"TPOT's band ({p.band.label()}) spans {p.band.low(p.tpot_s) * 1000:,.2f} to "
            f"{p.band.high(p.tpot_s) * 1000:,.2f} ms." if p.band is not None else "No band: no performance factors.")
    desc = (f"{rows[0][0]} {rows[0][2] * 1000:,.2f} ms: " + "; ".join(f"{t.name} {t.seconds * 1000:,.2f} ms" for t in p.ttft_terms)
            + f". TPOT {p.tpot_s * 1000:,.2f} ms: "
            + "; ".join(f"{t.name} {t.seconds * 1000:,.2f} ms" for t in p.tpot_terms) + f". {band}")
    return charts.svg(fig, "predicted TTFT and TPOT", desc)


def prediction_html(p: Prediction | RolePrediction) -> str:
    """The headline figures with their band, the chart, and every term (the text report's, plan_report.perf_report)."""
    from k3deploy.plan_report.perf_report import band_line, shown

    s = shown(p)
    parts = [table(s.title, ("figure", "value", "band", "bound by"), s.rows, numeric=(1, 2)),
             f"<p>{esc(band_line(s.band))}</p>", *(f"<p>{esc(n)}.</p>" for n in s.notes)]
    parts.append(figure(prediction_svg(p), "Each bar is the sum of the terms in its legend; the whisker on TPOT is "
                        "the prediction's band."))
    for title, terms in s.sections:
        parts.append(table(title, ("term", "ms", "how"), [(t.name, f"{t.seconds * 1000:,.2f}", t.how) for t in terms],
                           numeric=(1,)))
    return "".join(parts)


def _issues(file: str, issues: Sequence[Issue]) -> str:
    if not issues:
        return ""
    rows = [(i.severity, i.render(file), i.code) for i in
            sorted(issues, key=lambda i: ("error", "warning", "info").index(i.severity))]
    return table("Legality and feasibility", ("severity", "finding", "code"), rows)


def _plan_section(r: FileResult, p: Prediction | RolePrediction | None, asked: bool) -> str:
    plan = r.plan
    if plan is None or r.load_issues:
        return f"<section><h2>{esc(r.file)}: <span class=\"fail\">INVALID</span></h2>{_issues(r.file, r.issues)}</section>"
    verdict = ("<span class=\"pass\">FEASIBLE</span>" if plan.feasible else
               "<span class=\"fail\">INFEASIBLE</span>" if plan.valid else "<span class=\"fail\">INVALID</span>")
    parts = [f"<section><h2>{esc(plan.file)}: {esc(plan.topology.name)} {verdict}</h2>"]
    s = plan.shape
    if s is not None:
        hw = f" {plan.hardware.id}" if plan.hardware else ""
        parts.append(f"<p>{esc(plan.topology.engine.kind)} TP{s.tp}/EP{s.ep}/DP{s.dp}/PP{s.pp}/DCP{s.dcp} "
                     f"attn_tp={s.attn_tp} world={s.world_size} on {s.nnodes} x {s.gpus_per_node}{esc(hw)}</p>")
    parts.append(_issues(plan.file, plan.issues))
    if plan.pd is not None:
        for role in (plan.pd.prefill, plan.pd.decode):
            label = f"{role.role}: "
            parts.append(f"<h3>{esc(role.role)} x {role.instances}</h3>")
            if role.plan.memory is not None:
                parts.append(budget_html(role.plan, label))
            if role.plan.capacity is not None:
                parts.append(capacity_html(role.plan, label))
    else:
        if plan.memory is not None:
            parts.append(budget_html(plan))
        if plan.capacity is not None:
            parts.append(capacity_html(plan))
    if p is not None:
        parts.append("<h3>Prediction</h3>" + prediction_html(p))
    elif asked:
        parts.append("<p class=\"skip\">no prediction for --workload: the plan is not feasible</p>")
    return "".join(parts) + "</section>"


def plan_page(results: Sequence[FileResult], predictions: Sequence[Prediction | RolePrediction | None], asked: bool
              ) -> str:
    """The whole `plan --html` page, one section per file."""
    names = ", ".join(r.file for r in results)
    body = "".join(_plan_section(r, p, asked) for r, p in zip(results, predictions))
    return document(f"k3deploy plan: {names}", "the per-GPU memory budget as the stack it is"
                    + (", and the workload's prediction with its band" if asked else ""), body)
