"""`top` in the terminal: one row per engine page, its window's figures beside the prediction for that load."""
from __future__ import annotations

from typing import TYPE_CHECKING

from k3deploy.launch.top import Predicted, Row, TopReport

if TYPE_CHECKING:
    from rich.console import RenderableType


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _measured(row: Row) -> list[str]:
    return [_num(row.running, ",.0f"), _num(row.waiting, ",.0f"), _pct(row.kv_use), _pct(row.prefix_hit_rate),
            _num(row.generated_tok_s, ",.0f"), _num(row.ttft_ms, ",.1f"), _num(row.tpot_ms, ",.1f")]


def _predicted(p: Predicted) -> list[str]:
    return [f"cap {p.capacity_running:,}", "", "", "", f"{p.generated_tok_s:,.0f}", f"{p.ttft_ms:,.1f}",
            f"{p.tpot_ms:,.1f}"]


def top_view(report: TopReport) -> RenderableType:
    """The table, then each lagging or missing source named in words below it."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{report.name}: last {report.window_s:g} s, each instance measured and, below it, "
                        "predicted for that load", title_justify="left")
    for header in ("source", "running", "wait", "KV", "hits", "tok/s", "TTFT ms", "TPOT ms"):
        table.add_column(header, justify="left" if header == "source" else "right", no_wrap=header == "source")
    notes: list[Text] = []
    for row in report.rows:
        label = row.label if row.kind == "instance" else f"{row.label} (router)"
        if row.missing:
            table.add_row(label, *(["-"] * 7), style="dim")
            notes.append(Text(f"{row.label}: no figures: {row.missing}", style="yellow"))
            continue
        table.add_row(label, *_measured(row), style="bold red" if row.lag else None)
        if set(_measured(row)) == {"-"}:
            notes.append(Text(f"{row.label}: its /metrics answers without the engine figures top reads", style="dim"))
        if row.predicted is not None:
            table.add_row("  predicted", *_predicted(row.predicted), style="dim")
        if row.lag:
            notes.append(Text(f"{row.label} LAGS: {row.lag}", style="bold red"))
        if row.predicted is not None and row.predicted.band:
            notes.append(Text(f"{row.label}: predicted at {row.predicted.concurrency} running, "
                              f"{row.predicted.input_tokens:,} in / {row.predicted.output_tokens:,} out "
                              f"(band {row.predicted.band})", style="dim"))
        elif row.prediction_note:
            notes.append(Text(f"{row.label}: no prediction: {row.prediction_note}", style="dim"))
    return Group(table, *notes)
