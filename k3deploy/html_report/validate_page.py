"""`validate --html`: every stage with its evidence, grouped per instance of a service (a stage named
`shards[r0]` ran on instance r0's nodes; the request stages ran once, through the router), and the effort stage's
TTFT, TPOT and ITL distributions drawn against the prediction."""
from __future__ import annotations

import json
import re
from typing import Any

from k3deploy.html_report import charts
from k3deploy.html_report.page import document, esc, figure, table
from k3deploy.validate.pipeline import NOT_IMPLEMENTED, Report
from k3deploy.validate.stage import StageResult

_LABELLED = re.compile(r"^(?P<stage>[\w-]+)\[(?P<label>[^\]]+)\]$")
WORKLOADS = (("cold", "cold"), ("prefix_hit", "prefix hit"))
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"))
PREDICTED_FOR = "cold"  # validate holds the cold run (every prompt unique) against the prediction


def _group(name: str) -> str:
    """The instance a stage ran on ('' for a stage of the whole unit)."""
    found = _LABELLED.match(name)
    return found.group("label") if found else ""


def predicted_ms(results: dict[str, Any]) -> dict[str, tuple[float, float, float] | None]:
    """Metric -> (predicted mean, band low, band high) in ms, from the stage's prediction (one instance's, or
    each role's: TTFT the prefill role's, TPOT and ITL the decode role's); None where nothing was predicted."""
    one, roles = results.get("predicted"), results.get("predicted_per_role")
    if isinstance(one, dict):
        ttft, tpot, band = one.get("mean_ttft_ms"), one.get("mean_tpot_ms"), one.get("band")
    elif isinstance(roles, dict):
        ttft = (roles.get("prefill") or {}).get("mean_ttft_ms")
        tpot, band = (roles.get("decode") or {}).get("mean_tpot_ms"), roles.get("band")
    else:
        return {key: None for key, _ in METRICS}
    rel = float(band["rel"]) if isinstance(band, dict) and "rel" in band else 0.0

    def ranged(x: float | None, banded: bool) -> tuple[float, float, float] | None:
        if x is None:
            return None
        return (x, x / (1 + rel), x * (1 + rel)) if banded else (x, x, x)

    # The band holds for TPOT (and so ITL, whose mean is TPOT's); TTFT carries none.
    return {"ttft": ranged(ttft, False), "tpot": ranged(tpot, True), "itl": ranged(tpot, True)}


def _measured(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(label, results[key]) for key, label in WORKLOADS if isinstance(results.get(key), dict)
            and results[key].get("completed")]


def distribution_svg(stage: StageResult) -> str:
    """Per metric, each workload's p50-p90 box, p90-p99 whisker and mean, beside the predicted mean and band."""
    runs = _measured(stage.results)
    pred = predicted_ms(stage.results)
    with charts.rc():
        fig = charts.new_figure(9.0, 1.15 + 1.05 * len(METRICS))
        axes = fig.subplots(len(METRICS), 1)
        for ax, (key, label) in zip(axes, METRICS):
            top = 0.0
            for y, (name, s) in enumerate(runs):
                p50, p90, p99, mean = (s.get(f"{k}_{key}_ms", 0.0) for k in ("median", "p90", "p99", "mean"))
                colour = charts.PALETTE[y]
                ax.barh([y], [max(p90 - p50, 0.0)], left=p50, height=0.45, color=colour)
                ax.plot([p90, p99], [y, y], color=colour, linewidth=1.6)
                ax.plot([p99], [y], marker="|", markersize=12, color=colour)
                ax.plot([mean], [y], marker="D", markersize=5.5, color="#222222", linestyle="none")
                top = max(top, p99)
            got = pred[key]
            rows = [y for y, (name, _) in enumerate(runs) if name == PREDICTED_FOR]
            if got is not None and rows:  # the prediction is of the cold run: drawn on its row alone
                x, lo, hi = got
                y = rows[0]
                if hi > lo:
                    ax.fill_betweenx([y - 0.4, y + 0.4], lo, hi, color="#dddddd", linewidth=0, zorder=0)
                ax.plot([x, x], [y - 0.4, y + 0.4], color="#222222", linestyle="--", linewidth=1.1)
                top = max(top, hi)
            ax.set_xlim(0, top * 1.08 if top > 0 else 1)
            ax.set_yticks(range(len(runs)), [name for name, _ in runs])
            ax.set_ylim(-0.6, len(runs) - 0.4)
            ax.invert_yaxis()
            ax.set_xlabel(f"{label} ms")
        axes[0].set_title(f"{stage.name}: measured distributions against the prediction", loc="left", fontsize=10)
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        fig.legend(handles=[Patch(color=charts.PALETTE[0], label="p50 to p90"),
                            Line2D([], [], color=charts.PALETTE[0], marker="|", markersize=10, label="to p99"),
                            Line2D([], [], color="#222222", marker="D", linestyle="none", label="measured mean"),
                            Line2D([], [], color="#222222", linestyle="--", label="predicted mean"),
                            Patch(color="#dddddd", label="prediction band")],
                   loc="outside lower center", ncol=5, frameon=False, fontsize=8)
    return charts.svg(fig, f"{stage.name} latency distributions", _distribution_desc(runs, pred))


def _distribution_desc(runs: list[tuple[str, dict[str, Any]]],
                       pred: dict[str, tuple[float, float, float] | None]) -> str:
    parts = []
    for key, label in METRICS:
        got = pred[key]
        said = [f"{name} p50 {s.get(f'median_{key}_ms', 0.0):,.1f}, p90 {s.get(f'p90_{key}_ms', 0.0):,.1f}, "
                f"p99 {s.get(f'p99_{key}_ms', 0.0):,.1f}, mean {s.get(f'mean_{key}_ms', 0.0):,.1f} ms"
                for name, s in runs]
        expected = ("; cold's predicted mean " + f"{got[0]:,.1f} ms" + (f" (band {got[1]:,.1f}-{got[2]:,.1f})"
                                                                  if got[2] > got[1] else "")
                    if got is not None else "; not predicted")
        parts.append(f"{label}: " + "; ".join(said) + expected)
    return ". ".join(parts) + "."


def distribution_table(stage: StageResult) -> str:
    """The chart's figures as a table."""
    pred = predicted_ms(stage.results)
    rows = []
    for key, label in METRICS:
        got = pred[key]
        for name, s in _measured(stage.results):
            rows.append((label, name, *(f"{s.get(f'{k}_{key}_ms', 0.0):,.2f}" for k in ("mean", "median", "p90", "p99",
                                                                                       "std")),
                         f"{got[0]:,.2f}" if got is not None and name == PREDICTED_FOR else "-",
                         f"{got[1]:,.2f}-{got[2]:,.2f}" if got is not None and got[2] > got[1]
                         and name == PREDICTED_FOR else "-"))
    return table(f"{stage.name}: latency distributions (ms)", ("metric", "workload", "mean", "p50", "p90", "p99", "std",
                                                              "predicted mean", "band"), rows,
                 numeric=(2, 3, 4, 5, 6, 7, 8))


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(", ", ": "))
    return str(v)


def _stage_html(stage: StageResult) -> str:
    parts = [(f"<div class=\"stage\"><h3>{esc(stage.name)} <span class=\"{esc(stage.status)}\">"
             f"{esc(stage.status.upper())}</span> <small>{stage.seconds:,.1f} s</small></h3>"),
             f"<p>{esc(stage.detail)}</p>"]
    if stage.evidence:
        parts.append(f"<p><strong>evidence</strong></p><pre>{esc(stage.evidence)}</pre>")
    if stage.nodes:
        parts.append(table(f"{stage.name}: per node", ("rank", "host", "status", "detail", "problems", "fix"),
                           [(n.rank, n.host, n.status, n.detail, "; ".join(n.problems), n.fix) for n in stage.nodes],
                           numeric=(0,)))
    results = dict(stage.results)
    if _measured(results):
        parts.append(figure(distribution_svg(stage), "Per workload: the box spans p50 to p90, the whisker reaches p99, "
                            "the diamond is the mean; on the cold run's row (the one validate holds against the "
                            "prediction) the dashed line is the predicted mean, the grey band the prediction's band "
                            "(TPOT and ITL)."))
        parts.append(distribution_table(stage))
        for key, _ in WORKLOADS:
            summary = results.pop(key, None)
            if isinstance(summary, dict):
                kept = {k: v for k, v in summary.items() if not re.match(r"(mean|median|std|p90|p99)_(ttft|tpot|itl)_ms$", k)}
                parts.append(table(f"{stage.name}: {key} run", ("figure", "value"),
                                   [(k, _value(v)) for k, v in kept.items()], numeric=(1,)))
    served = results.pop("served_by", None)
    if isinstance(served, dict):
        parts.append(table(f"{stage.name}: served by", ("replica", "requests"), sorted(served.items()), numeric=(1,)))
    if results:
        parts.append(table(f"{stage.name}: results", ("result", "value"), [(k, _value(v)) for k, v in results.items()]))
    return "".join(parts) + "</div>"


def validate_page(report: Report) -> str:
    """The whole page: the verdict, every stage in a summary table, then each group's stages in full."""
    verdict = "PASSED" if report.passed else "FAILED"
    summary = table("Stages", ("stage", "status", "seconds", "detail"),
                    [(s.name, s.status.upper(), f"{s.seconds:,.1f}", s.detail) for s in report.stages], numeric=(2,))
    body = [(f"<p>Verdict: <span class=\"{'pass' if report.passed else 'fail'}\">{verdict}</span> "
            f"(exit {report.exit_code})</p>"), summary]
    if report.not_implemented:
        body.append(f"<p>{esc(NOT_IMPLEMENTED)}, not run: {esc(', '.join(report.not_implemented))}</p>")
    groups: dict[str, list[StageResult]] = {}
    for stage in report.stages:
        groups.setdefault(_group(stage.name), []).append(stage)
    several = len(groups) > 1
    for label, stages in groups.items():
        heading = (f"instance {label}: its nodes" if label else
                   "through the router: the requests" if several else "stages")
        body.append(f"<section><h2>{esc(heading)}</h2>{''.join(_stage_html(s) for s in stages)}</section>")
    return document(f"k3deploy validate {report.deployment}: {verdict}",
                    "every stage with its evidence" + ("; per instance of the service" if several else ""),
                    "".join(body))
