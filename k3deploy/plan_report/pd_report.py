"""The `plan` report of prefill/decode roles: each role's shape, budget and capacity, then the pool."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from k3deploy.plan_report.report_tables import budget_table, capacity_table, quantity_table, vision_line
from k3deploy.planning.plan_model import Plan

# What each role's cache is for: prefill keeps a request's KV and KDA state only until decode has fetched it.
ROLE_NOTE = {"prefill": "weights, activations and a short-lived cache (held until decode fetches it)",
             "decode": "MLA KV and the KDA state pool for the concurrency (the serving cache)"}


def pd_table(plan: Plan) -> Table:
    """What both roles hold together, and the router in PD mode."""
    pd = plan.pd
    assert pd is not None
    t = quantity_table(f"Pool ({pd.prefill.instances}P{pd.decode.instances}D over {pd.backend})")
    for role in (pd.prefill, pd.decode):
        t.add_row(f"{role.role} GPUs ({role.instances} x {role.gpus_per_instance})",
                  f"{role.instances * role.gpus_per_instance:,}")
    cap = pd.decode.plan.capacity
    if cap is not None:
        t.add_row("decode KV tokens, all instances", f"{pd.decode.instances * cap.kv_tokens:,}")
        t.add_row("concurrent requests, all decode instances", f"{pd.decode.instances * cap.max_running_requests:,}")
    pcap = pd.prefill.plan.capacity
    if pcap is not None:
        t.add_row("prefill cache tokens, all instances", f"{pd.prefill.instances * pcap.kv_tokens:,}")
    r = plan.router
    if r is not None:
        s = r.settings
        t.add_row(f"router {s.kind} (PD mode) on {r.runs_on}", s.url)
        for url, port in s.prefill:
            t.add_row("  prefill", url + (f" bootstrap {port}" if port is not None else ""))
        for url in s.decode:
            t.add_row("  decode", url)
        t.add_row("router health-check timeout", f"{s.health_check_timeout_s:,} s")
        t.add_row("router start-up timeout", f"{s.startup_timeout_s:,} s")
    return t


def pd_parts(plan: Plan) -> list[Any]:
    """Each role's section, then the pool."""
    pd = plan.pd
    assert pd is not None
    parts: list[Any] = []
    for r in (pd.prefill, pd.decode):
        p, s = r.plan, r.plan.shape
        line = f"{r.role} x {r.instances}: {ROLE_NOTE[r.role]}"
        if s is not None:
            line += (f"\n  TP{s.tp}/EP{s.ep}/DP{s.dp}/PP{s.pp}/DCP{s.dcp} attn_tp={s.attn_tp} world={s.world_size} "
                     f"on {s.nnodes} x {s.gpus_per_node} per instance")
        parts.append(Text(line, style="bold"))
        if p.memory is not None:
            parts.append(budget_table(p, f"{r.role}: "))
            parts += vision_line(p)
        if p.capacity is not None:
            parts.append(capacity_table(p, f"{r.role}: "))
    parts.append(pd_table(plan))
    return parts
