"""Plan reports: the rich tables `k3deploy plan` prints (the JSON documents are in `document`)."""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from k3deploy.diagnostics import Issue
from k3deploy.planning.arith import GIB
from k3deploy.planning.plan import Plan
from k3deploy.planning.search import ShapeRow


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f}"


def issues_table(file: str, issues: tuple[Issue, ...] | list[Issue]) -> Table:
    """One row per issue, errors first."""
    t = Table(title="Legality and feasibility", title_justify="left", show_lines=False)
    for col in ("severity", "code", "where", "message"):
        t.add_column(col, overflow="fold")
    style = {"error": "bold red", "warning": "yellow", "info": "dim"}
    for i in sorted(issues, key=lambda i: ("error", "warning", "info").index(i.severity)):
        msg = i.message + (f" ({i.hint})" if i.hint else "")
        t.add_row(Text(i.severity, style=style[i.severity]), i.code, f"{i.location(file)} {i.path}", msg)
    return t


def budget_table(plan: Plan) -> Table:
    """The per-GPU memory budget, every line item; the lines sum to usable memory."""
    m = plan.memory
    assert m is not None
    t = Table(title=f"Per-GPU memory ({plan.hardware.name if plan.hardware else ''})", title_justify="left")
    t.add_column("line item")
    t.add_column("GiB", justify="right")
    t.add_column("bytes", justify="right")
    t.add_column("how", overflow="fold")
    s = plan.shape
    assert s is not None
    rows = [
        ("weights: routed experts", m.routed_weights_bytes, f"routed / {s.expert_shards} ({s.experts_per_rank} experts per EP rank)"),
        ("weights: non-expert", m.non_expert_weights_bytes, f"non-expert / attn_tp {s.attn_tp}"),
        ("runtime reserve", m.reserve_bytes, "activations, CUDA graphs, NCCL buffers, fragmentation"),
        ("MLA KV pool", m.kv_pool_bytes, f"{m.mla_kv_bytes_per_token:,.0f} B/token x {m.kv_tokens:,} tokens"),
        ("KDA state pool", m.state_pool_bytes, f"{m.kda_state_bytes_per_slot:,} B/slot x {m.slots_per_request} slots/request"
         + (f"; pool ratio {m.pool_ratio:.4f}" if m.pool_ratio else "") + (f"; block {m.block_tokens} tokens" if m.block_tokens else "")),
        ("free headroom", m.headroom_bytes, f"outside the engine's pools (mem_fraction {m.mem_fraction})"),
    ]
    for name, n, how in rows:
        t.add_row(name, Text(_gib(n), style="red" if n < 0 else ""), f"{n:,}", how)
    t.add_row(Text("usable", style="bold"), Text(_gib(m.usable_bytes), style="bold"), f"{m.usable_bytes:,}", "")
    return t


def capacity_table(plan: Plan) -> Table:
    """KV tokens, concurrency and context at that concurrency."""
    c = plan.capacity
    assert c is not None
    t = Table(title="Capacity", title_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("KV tokens in the pool", f"{c.kv_tokens:,}")
    t.add_row("max concurrent requests", f"{c.max_running_requests:,}")
    t.add_row("longest context at that concurrency", f"{c.max_context_tokens:,}")
    return t


def plan_renderable(plan: Plan) -> Group:
    """Everything `plan` shows for one file."""
    s = plan.shape
    verdict = Text("FEASIBLE", style="bold green") if plan.feasible else Text("INFEASIBLE", style="bold red")
    head = Text.assemble(f"{plan.file}: {plan.topology.name} ", verdict)
    if s is not None:
        head.append(f"  {plan.topology.engine.kind} TP{s.tp}/EP{s.ep}/DP{s.dp}/PP{s.pp}/DCP{s.dcp} attn_tp={s.attn_tp} "
                    f"world={s.world_size} on {s.nnodes} x {s.gpus_per_node} {plan.hardware.id if plan.hardware else ''}")
    parts: list[Any] = [head]
    if plan.issues:
        parts.append(issues_table(plan.file, plan.issues))
    if plan.memory is not None:
        parts.append(budget_table(plan))
    if plan.capacity is not None:
        parts.append(capacity_table(plan))
    return Group(*parts)


def search_table(hardware: str, gpus: int, engine: str, rows: list[ShapeRow]) -> Table:
    """`plan --search` as a table."""
    t = Table(title=f"Legal shapes for {gpus} x {hardware} with {engine}", title_justify="left")
    for col in ("tp", "ep", "dp", "pp", "dcp", "attn_tp", "weights GiB", "free GiB", "verdict"):
        t.add_column(col, justify="right" if col != "verdict" else "left", overflow="fold")
    for r in rows:
        verdict = Text("feasible", style="green") if r.feasible else Text(f"infeasible: {r.reason}", style="red")
        t.add_row(str(r.tp), str(r.ep), str(r.dp), str(r.pp), str(r.dcp), str(r.attn_tp), _gib(r.weights_bytes),
                  _gib(r.headroom_bytes), verdict)
    return t
