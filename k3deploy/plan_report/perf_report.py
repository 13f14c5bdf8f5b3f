"""The prediction as `plan --workload` shows it: a table explained term by term."""
from __future__ import annotations

from typing import Any

from k3deploy.planning.perf_band import Band
from k3deploy.planning.prediction import Prediction


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f}"


def band_line(band: Band | None) -> str:
    """`band: calibrated ±27% (why)`: the line under the headline table."""
    return f"band: {band.label()}: {band.why}" if band is not None else "band: none (no performance factors)"


def _span(band: Band | None, x: float, unit: str) -> str:
    return f"{band.low(x):,.1f}-{band.high(x):,.1f}{unit}" if band is not None else ""


def prediction_renderable(p: Prediction) -> Any:
    """Headline figures with their bounds, then every term of the decode step and the prefill."""
    from rich.console import Group
    from rich.text import Text

    from k3deploy.plan_report.report_tables import simple_table

    w = p.workload
    head = simple_table(
        f"Predicted for {w.input_tokens:,} in / {w.output_tokens:,} out at concurrency {w.concurrency} "
        f"(effort {w.effort}; {p.gpus} GPUs)",
        (("figure", "left"), ("value", "right"), ("band", "right"), ("bound by", "left")),
        (("TTFT (mean)", f"{_ms(p.ttft_s)} ms", "", p.bound("ttft")),
         ("TPOT (mean)", f"{_ms(p.tpot_s)} ms", _span(p.band, p.tpot_s * 1000, " ms"), p.bound("tpot")),
         ("ITL (mean)", f"{_ms(p.tpot_s)} ms", "", "as TPOT"),
         ("output tok/s", f"{p.output_throughput:,.0f}", _span(p.band, p.output_throughput, ""), p.bound("tpot")),
         ("output tok/s per GPU", f"{p.output_throughput_per_gpu:,.1f}", "", f"over {p.gpus} GPUs")))
    parts: list[Any] = [head, Text(band_line(p.band), style="dim")]
    if w.images and w.image_px is not None and w.text_tokens is not None:
        wpx, hpx = w.image_px
        parts.append(Text(f"{w.input_tokens:,} in = {w.text_tokens:,} text + {w.images} image(s) of {wpx}x{hpx} px "
                          f"x {w.image_tokens:,} tokens each (its pads by the model's image processor, "
                          "plus the media markers around them)"))
    if p.capped_by:
        parts.append(Text(f"{p.running} requests run at once (capped by {p.capped_by}); the rest wait",
                          style="yellow"))
    for title, terms in (("TPOT", p.tpot_terms), ("TTFT", p.ttft_terms),
                         (f"decode step at batch {p.running} (per GPU)", p.decode.terms),
                         (f"prefill of {w.input_tokens:,} tokens (per GPU, one stage)", p.prefill.terms)):
        parts.append(simple_table(title, (("term", "left"), ("ms", "right"), ("how", "left")),
                                  [(t.name, _ms(t.seconds), t.how) for t in terms]))
    parts.append(Text("decode step = max(HBM reads, compute) + collectives + per-layer overhead; factors from "
                      "the catalog's `performance` entry for this engine", style="dim"))
    return Group(*parts)
