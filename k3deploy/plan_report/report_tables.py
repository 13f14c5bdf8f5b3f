"""The per-GPU memory budget and capacity tables of a plan (the whole plan's, or one role's in PD)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from rich import box
from rich.table import Table
from rich.text import Text

from k3deploy.diagnostics import fmt_gib
from k3deploy.planning.arith import GIB
from k3deploy.planning.plan_model import Plan


def gib_cell(n: float) -> str:
    """Bytes as a GiB table cell."""
    return f"{n / GIB:,.2f}"


def quantity_table(title: str) -> Table:
    """An empty two-column table (quantity, value right-aligned) titled at the left."""
    t = Table(title=title, title_justify="left")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    return t


def simple_table(title: str, columns: Sequence[tuple[str, Literal["left", "right"]]],
                 rows: Sequence[Sequence[str | Text]]) -> Table:
    """A left-titled SIMPLE_HEAD table (no edge padding): the shape of every table `plan` prints."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for header, justify in columns:
        t.add_column(header, justify=justify)
    for row in rows:
        t.add_row(*row)
    return t


def budget_rows(plan: Plan) -> list[tuple[str, int, list[str]]]:
    """The per-GPU memory budget's line items (name, bytes, how in phrases); they sum to usable memory."""
    m = plan.memory
    assert m is not None
    s = plan.shape
    assert s is not None
    kv_kind = "GQA" if plan.model is not None and plan.model.architecture.attention == "gqa" else "MLA"
    kda = [f"{m.kda_state_bytes_per_slot:,} B/slot"]
    kda += [f"+ {m.replay_ring_bytes_per_slot:,} B/slot ReplaySSM ring"] if m.replay_ring_bytes_per_slot else []
    kda += [f"x {m.slots_per_request} slots/request" + (f" ({m.draft_slots} for the draft)" if m.draft_slots else "")]
    kda += [f"pool ratio {m.pool_ratio:.4f}"] if m.pool_ratio else []
    kda += [f"block {m.block_tokens} tokens"] if m.block_tokens else []
    # SGLang's static memory beside the weights and pools: what was resident before the load, and at it.
    static = ([f"{fmt_gib(m.engine_preload_bytes)} before the load", "(CUDA context, NCCL),",
               f"{fmt_gib(m.engine_static_bytes - m.engine_preload_bytes)} at it (buffers,", "workspaces)"]
              if m.engine_preload_bytes else ["held in the static share", "when the pools are sized"]
              ) if m.engine_static_bytes else []
    rows: list[tuple[str, int, list[str]]] = [
        ("weights: routed experts", m.routed_weights_bytes,
         [f"routed / {s.expert_shards}", f"({s.experts_per_rank} experts per EP rank)"]),
        ("weights: non-expert", m.non_expert_weights_bytes, [f"non-expert / attn_tp {s.attn_tp}"]),
        *([("weights: draft model", m.draft_weights_bytes, [f"draft / attn_tp {s.attn_tp}"])]
          if m.draft_weights_bytes else []),
        *([] if static else [("runtime reserve", m.reserve_bytes, ["activations, CUDA graphs,",
                                                                   "NCCL buffers, fragmentation"])]),
        *([("engine static memory", m.engine_static_bytes, static)] if static else []),
        *([("vision tower", m.vision_bytes, _vision_how(plan))] if m.vision_bytes else []),
        (f"{kv_kind} KV pool", m.kv_pool_bytes, [f"{m.mla_kv_bytes_per_token:,.0f} B/token"]
         + ([f"+ {m.draft_kv_bytes_per_token:,.0f} B/token draft KV"] if m.draft_kv_bytes_per_token else [])
         + [f"x {m.kv_tokens:,} tokens"]),
        ("KDA state pool", m.state_pool_bytes, kda),
        # SGLang leaves (1 - mem_fraction) x what was free before the load; the reserve comes out of it.
        ("free after the pools", m.reserve_bytes + m.headroom_bytes,
         [f"(1 - {m.mem_fraction}) x free before", "the load; the runtime", f"reserve {fmt_gib(m.reserve_bytes)} of it",
          "(activations, CUDA graphs)", f"leaves {fmt_gib(m.headroom_bytes)}"])
        if static else ("headroom", m.headroom_bytes, ["outside the engine's pools", f"(mem_fraction {m.mem_fraction})"]),
    ]
    return rows


def _vision_how(plan: Plan) -> list[str]:
    """The vision row's "how": the replicated tower's rest and the profiled encoder outputs."""
    v = plan.vision
    if v is None:
        return ["beyond the non-expert line"]
    how = ["beyond the non-expert line:"]
    how += [f"{fmt_gib(v.extra_bytes)} {v.placement} tower", f"({fmt_gib(v.per_gpu_bytes)} less the",
            f"{fmt_gib(v.counted_bytes)} counted there)"] if v.extra_bytes else []
    how += [f"{'+ ' if v.extra_bytes else ''}{fmt_gib(v.profile_bytes)} encoder outputs",
            f"of {v.profile_images} profiled image(s)"] if v.profile_bytes else []
    return how


def budget_table(plan: Plan, role: str = "") -> Table:
    """The per-GPU memory budget, every line item; the lines sum to usable memory. The "how" cells are
    broken at phrase boundaries so the table reads at 80 columns."""
    m = plan.memory
    assert m is not None
    cells: list[tuple[str | Text, ...]] = [(name, Text(gib_cell(n), style="red" if n < 0 else ""), f"{n:,}",
                                            "\n".join(how)) for name, n, how in budget_rows(plan)]
    cells.append((Text("usable", style="bold"), Text(gib_cell(m.usable_bytes), style="bold"), f"{m.usable_bytes:,}", ""))
    return simple_table(f"{role}Per-GPU memory ({plan.hardware.name if plan.hardware else ''})",
                        (("line item", "left"), ("GiB", "right"), ("bytes", "right"), ("how", "left")), cells)


def capacity_table(plan: Plan, role: str = "") -> Table:
    """KV tokens, concurrency and context at that concurrency."""
    c = plan.capacity
    assert c is not None
    t = quantity_table(f"{role}Capacity")
    t.add_row("KV tokens in the pool", f"{c.kv_tokens:,}")
    t.add_row("max concurrent requests", f"{c.max_running_requests:,}")
    t.add_row("longest context at that concurrency", f"{c.max_context_tokens:,}")
    return t


def vision_line(plan: Plan) -> list[Text]:
    """Where the engine keeps the vision tower, and what it holds beyond the budget's non-expert share (none for
    a text-only model)."""
    v, spec = plan.vision, plan.model.vision if plan.model is not None else None
    if v is None or spec is None or plan.memory is None:
        return []
    head = f"vision tower ({spec.encoder}, {spec.params / 1e6:,.0f}M {spec.dtype.upper()}, {fmt_gib(v.tower_bytes)}): "
    if v.placement == "absent":
        return [Text(head + v.why, style="dim")]
    text = f"{v.placement}, {fmt_gib(v.per_gpu_bytes)} per GPU: {v.why}"
    if v.pool_bytes:
        text += (f"; the non-expert line counts {fmt_gib(v.counted_bytes)} of it, the pools are smaller by the "
                 f"{fmt_gib(v.pool_bytes)} on the budget's vision line")
    return [Text(head + text)]
