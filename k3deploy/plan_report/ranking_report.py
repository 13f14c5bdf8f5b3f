"""`plan --search --workload` as a table: one line per shape (of a topology with roles, per prefill/decode layout),
best first, and why the top one wins."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from k3deploy.plan_report.perf_report import band_line
from k3deploy.planning.ranking import RankedShape, parallel_name, shape_name
from k3deploy.planning.workload import Workload

if TYPE_CHECKING:  # only the search of a topology with roles builds them
    from k3deploy.planning.role_search import RoleLayout


def ranked_table(hardware: str, gpus: int, engine: str, w: Workload, objective: str, rows: list[RankedShape],
                 why: str) -> Group:
    """Shape, predicted figures and the bound of TPOT; shapes that do not fit or miss --tpot-max last."""
    t = Table(title=f"Shapes for {gpus} x {hardware} with {engine}, ranked by {objective} at {w.input_tokens:,} in"
              f" / {w.output_tokens:,} out, concurrency {w.concurrency}", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("shape", "TTFT ms", "TPOT ms", "tok/s/GPU", "batch", "bound"):
        t.add_column(col, justify="left" if col in ("shape", "bound") else "right", no_wrap=True)
    for r in rows:
        p = r.prediction
        if p is None:
            t.add_row(shape_name(r), "-", "-", "-", "-", Text("does not fit", style="red"))
            continue
        t.add_row(shape_name(r), f"{p.ttft_s * 1000:,.0f}", f"{p.tpot_s * 1000:,.2f}",
                  f"{p.output_throughput_per_gpu:,.1f}", Text(str(p.running), style="yellow" if p.capped_by else ""),
                  Text(p.bound("tpot", short=True) if r.meets_tpot else "over --tpot-max",
                       style="" if r.meets_tpot else "yellow"))
    notes = [Text(why, style="bold"),
             Text("batch: requests its caches hold at once (sized with max_running_requests = concurrency); "
                  "`plan FILE --workload` explains one shape term by term", style="dim")]
    band = next((r.prediction.band for r in rows if r.prediction is not None), None)
    if band is not None:  # one accelerator and engine: every shape's band is the same
        notes.append(Text(band_line(band) + f" (TPOT x {1 / (1 + band.rel):.2f}-{1 + band.rel:.2f})", style="dim"))
    if any(r.drafts for r in rows):
        notes.append(Text("DSPARKn: n DSpark draft tokens per step (SGLang --speculative-algorithm DSPARK "
                          "--speculative-dspark-block-size n --enable-linear-replayssm-spec, the cookbook's recipe: the state pool "
                          "then holds no verify states; vLLM --speculative-config num_speculative_tokens n), "
                          "each keeping the catalog's draft_acceptance_length", style="dim"))
    return Group(t, *notes)


def layouts_table(file: str, gpus: dict[str, int], w: Workload, objective: str, rows: list[RoleLayout],
                  why: str) -> Group:
    """Prefill and decode shape, the service's predicted figures and the busier role, layouts over --tpot-max
    last; then the layouts that do not fit, counted by the issue that refuses them, with its reason (a search
    refuses most of its thousands of layouts: a line each would bury the ranking; `--json` lists each)."""
    t = Table(title=f"Prefill/decode layouts of {file} ({gpus['prefill']} prefill + {gpus['decode']} decode GPUs), "
              f"ranked by {objective} at {w.input_tokens:,} in / {w.output_tokens:,} out, concurrency "
              f"{w.concurrency}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("prefill", "decode", "TTFT ms", "TPOT ms", "tok/s/GPU"):
        t.add_column(col, justify="left" if col in ("prefill", "decode") else "right", no_wrap=True,
                     min_width=len(col))
    t.add_column("bound", no_wrap=True, overflow="ellipsis")  # a narrow terminal cuts a reason, not a figure
    refused: dict[str, list[RoleLayout]] = {}
    for r in rows:
        p = r.prediction
        if not r.feasible:
            refused.setdefault(r.code, []).append(r)
        elif p is None:
            t.add_row(parallel_name(r.prefill), parallel_name(r.decode), "-", "-", "-",
                      Text(f"not timed: {r.reason}", style="red"))
        else:
            busy = p.busy()
            role = max(busy, key=lambda k: busy[k])
            t.add_row(parallel_name(r.prefill), parallel_name(r.decode),
                      f"{p.ttft_s * 1000:,.0f}" if p.ttft_s is not None else "-", f"{p.tpot_s * 1000:,.2f}",
                      f"{p.output_throughput_per_gpu:,.1f}",
                      Text(f"{role} {busy[role]:.0%}" if r.meets_tpot else "over --tpot-max",
                           style="" if r.meets_tpot else "yellow"))
    notes = [Text(why, style="bold")]
    if refused:
        notes.append(Text(f"{sum(len(v) for v in refused.values()):,} layouts do not fit (`--json` lists each with "
                          "its reason), by what refuses them:", style="red"))
        for code, these in sorted(refused.items(), key=lambda kv: -len(kv[1])):
            e = these[0]
            notes.append(Text(f"  {len(these):>5,}  {code}, e.g. prefill {parallel_name(e.prefill)} with decode "
                              f"{parallel_name(e.decode)}: {e.reason}"))
    notes.append(Text("tok/s/GPU over both roles' GPUs; bound: the busier role, at its share of the rate it serves "
                      "flat out; `plan FILE --workload` explains the file's own layout term by term", style="dim"))
    band = next((r.prediction.band for r in rows if r.prediction is not None), None)
    if band is not None:
        notes.append(Text(band_line(band) + f" (TPOT x {1 / (1 + band.rel):.2f}-{1 + band.rel:.2f})", style="dim"))
    return Group(t, *notes)
