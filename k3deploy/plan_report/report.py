"""Plan reports: the rich tables `k3deploy plan` prints (the JSON documents are in `document`; the budget and
capacity tables, which each role's report shows too, are in `report_tables`)."""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from k3deploy.diagnostics import Issue
from k3deploy.plan_report.pd_report import pd_parts
from k3deploy.plan_report.report_tables import (
    budget_table,
    capacity_table,
    gib_cell,
    quantity_table,
    vision_line,
)
from k3deploy.planning.plan_model import Plan
from k3deploy.planning.search import ShapeRow


def issue_lines(file: str, issues: tuple[Issue, ...] | list[Issue]) -> Group:
    """One `severity file:line:col: path: message (hint) [CODE]` line per issue, errors first: a line wraps
    between words (never inside a location) and reads whole when piped."""
    style = {"error": "bold red", "warning": "yellow", "info": "dim"}
    lines = [Text("Legality and feasibility", style="italic")]
    for i in sorted(issues, key=lambda i: ("error", "warning", "info").index(i.severity)):
        lines.append(Text.assemble((f"{i.severity:<7} ", style[i.severity]), f"{i.render(file)} [{i.code}]"))
    return Group(*lines)


def pool_table(plan: Plan) -> Table:
    """What the replicas hold together, and the router's settings sized from the plan."""
    p = plan.pool
    assert p is not None
    t = quantity_table(f"Pool ({p.replicas} replicas)")
    t.add_row("GPUs (replicas x GPUs per replica)", f"{p.gpus:,}")
    t.add_row("KV tokens, all replicas", f"{p.kv_tokens:,}")
    t.add_row("concurrent requests, all replicas", f"{p.max_running_requests:,}")
    r = plan.router
    if r is not None:
        s = r.settings
        prefill = f"unknown ({r.prefill_unknown})" if r.longest_prefill_s is None else f"~{r.longest_prefill_s:,.1f} s"
        t.add_row(f"router {s.kind} on {r.runs_on}", s.url)
        t.add_row("router policy", s.policy)
        t.add_row("longest prefill a replica allows", prefill)
        t.add_row("router health-check timeout", f"{s.health_check_timeout_s:,} s")
        t.add_row("router start-up timeout", f"{s.startup_timeout_s:,} s")
    return t


def plan_renderable(plan: Plan) -> Group:
    """Everything `plan` shows for one file."""
    s = plan.shape
    verdict = (Text("FEASIBLE", style="bold green") if plan.feasible else
               Text("INFEASIBLE", style="bold red") if plan.valid else Text("INVALID", style="bold red"))
    head = Text.assemble(f"{plan.file}: {plan.topology.name} ", verdict)
    parts: list[Any] = [head]
    if s is not None:  # its own line: the headline reads at 80 columns
        hw = f" {plan.hardware.id}" if plan.hardware else ""
        parts.append(Text(f"  {plan.topology.engine.kind} TP{s.tp}/EP{s.ep}/DP{s.dp}/PP{s.pp}/DCP{s.dcp} "
                          f"attn_tp={s.attn_tp} world={s.world_size} on {s.nnodes} x {s.gpus_per_node}{hw}"))
    if plan.issues:
        parts.append(issue_lines(plan.file, plan.issues))
    if plan.pd is not None:
        return Group(head, *parts[2 if s is not None else 1:], *pd_parts(plan))
    if plan.memory is not None:
        parts.append(budget_table(plan))
        parts += vision_line(plan)
    if plan.capacity is not None:
        parts.append(capacity_table(plan))
    if plan.pool is not None:
        parts.append(pool_table(plan))
    return Group(*parts)


def search_table(hardware: str, gpus: int, engine: str, rows: list[ShapeRow], model: str | None = None) -> Group:
    """`plan --search` as a table, one line per shape; each distinct reason a shape is infeasible is a
    numbered note below it, said once and whole."""
    serving = f"{model} on {engine}" if model else engine
    t = Table(title=f"Legal shapes for {gpus} x {hardware} with {serving} (GiB per GPU)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("tp", "ep", "dp", "pp", "dcp", "attn_tp", "weights", "cache", "headroom", "verdict"):
        t.add_column(col, justify="right" if col != "verdict" else "left", no_wrap=True)
    notes: dict[str, int] = {}
    for r in rows:
        if r.feasible:
            verdict = Text("feasible", style="green")
        else:
            verdict = Text(f"no ({notes.setdefault(r.reason, len(notes) + 1)})", style="red")
        t.add_row(str(r.tp), str(r.ep), str(r.dp), str(r.pp), str(r.dcp), str(r.attn_tp), gib_cell(r.weights_bytes),
                  gib_cell(r.cache_bytes), gib_cell(r.headroom_bytes), verdict)
    legend = Text("cache: KV and KDA state pools; headroom: left outside the engine's pools after the "
                  "runtime reserve (as in `k3deploy plan`)", style="dim")
    return Group(t, legend, *(Text(f"({n}) {reason}") for reason, n in notes.items()))
