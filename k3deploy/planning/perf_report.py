"""The prediction as `plan --workload` shows it: a table explained term by term, and the JSON object."""
from __future__ import annotations

from typing import Any

from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import Term
from k3deploy.planning.plain_table import SimpleTable
from k3deploy.planning.prediction import Prediction


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f}"


def prediction_json(p: Prediction) -> dict[str, Any]:
    """`vllm bench serve` result fields, plus the terms behind them (milliseconds) and each figure's bound."""
    def terms(ts: tuple[Term, ...]) -> list[dict[str, Any]]:
        return [{"name": t.name, "ms": t.seconds * 1000, "how": t.how} for t in ts]

    return {
        **p.bench_fields(),
        "workload": p.workload.model_dump(), "running_requests": p.running, "capped_by": p.capped_by,
        "gpus": p.gpus,
        "bounds": {"ttft": p.bound("ttft"), "tpot": p.bound("tpot"), "itl": p.bound("tpot"),
                   "output_throughput": p.bound("tpot")},
        "ttft_terms": terms(p.ttft_terms), "tpot_terms": terms(p.tpot_terms),
        "decode_step_terms": terms(p.decode.terms), "prefill_terms": terms(p.prefill.terms),
        "band": band_json(p.band, p.tpot_s, p.output_throughput),
        # Only a calibrated prediction carries the key: an uncalibrated document is as it always was.
        **({"calibration": p.calibration.as_json()} if p.calibration is not None else {}),
    }


def band_json(band: Band | None, tpot_s: float, output_throughput: float) -> dict[str, Any] | None:
    """The band's kind, width and why, and the TPOT (ms) and output tok/s ranges it spans."""
    if band is None:
        return None
    return {**band.model_dump(), "mean_tpot_ms": [band.low(tpot_s) * 1000, band.high(tpot_s) * 1000],
            "output_throughput": [band.low(output_throughput), band.high(output_throughput)]}


def band_line(band: Band | None) -> str:
    """`band: calibrated ±43% (why)`: the line under the headline table."""
    return f"band: {band.label()}: {band.why}" if band is not None else "band: none (no performance factors)"


def _span(band: Band | None, x: float, unit: str) -> str:
    return f"{band.low(x):,.1f}-{band.high(x):,.1f}{unit}" if band is not None else ""


def prediction_renderable(p: Prediction) -> Any:
    """Headline figures with their bounds, then every term of the decode step and the prefill (the tables
    drawn by `plain_table` when the output is plain: rich's own layout of them was most of `plan --workload`)."""
    from rich.console import Group
    from rich.text import Text

    w = p.workload
    head = SimpleTable(
        f"Predicted for {w.input_tokens:,} in / {w.output_tokens:,} out at concurrency {w.concurrency} "
        f"(effort {w.effort}; {p.gpus} GPUs)",
        (("figure", "left"), ("value", "right"), ("band", "right"), ("bound by", "left")),
        (("TTFT (mean)", f"{_ms(p.ttft_s)} ms", "", p.bound("ttft")),
         ("TPOT (mean)", f"{_ms(p.tpot_s)} ms", _span(p.band, p.tpot_s * 1000, " ms"), p.bound("tpot")),
         ("ITL (mean)", f"{_ms(p.tpot_s)} ms", "", "as TPOT"),
         ("output tok/s", f"{p.output_throughput:,.0f}", _span(p.band, p.output_throughput, ""), p.bound("tpot")),
         ("output tok/s per GPU", f"{p.output_throughput_per_gpu:,.1f}", "", f"over {p.gpus} GPUs")))
    parts: list[Any] = [head, Text(band_line(p.band), style="dim")]
    if p.capped_by:
        parts.append(Text(f"{p.running} requests run at once (capped by {p.capped_by}); the rest wait",
                          style="yellow"))
    for title, terms in (("TPOT", p.tpot_terms), ("TTFT", p.ttft_terms),
                         (f"decode step at batch {p.running} (per GPU)", p.decode.terms),
                         (f"prefill of {w.input_tokens:,} tokens (per GPU, one stage)", p.prefill.terms)):
        parts.append(SimpleTable(title, (("term", "left"), ("ms", "right"), ("how", "left")),
                                 tuple((t.name, _ms(t.seconds), t.how) for t in terms)))
    parts.append(Text("decode step = max(HBM reads, compute) + collectives + per-layer overhead; factors from "
                      "the catalog's `performance` entry for this engine", style="dim"))
    return Group(*parts)
