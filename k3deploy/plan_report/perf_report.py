"""The prediction as `plan --workload` shows it (text and `--html` alike): headline figures with their band and
bound, then each figure's terms; one deployment's, or a prefill/decode service's per role."""
from __future__ import annotations

from typing import Any, NamedTuple

from k3deploy.planning.pd_prediction import RolePrediction
from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import Term
from k3deploy.planning.prediction import Prediction

FOOTNOTE = ("decode step = max(HBM reads, compute) + collectives + per-layer overhead; factors from the catalog's "
            "`performance` entry for this engine")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f}"


def band_line(band: Band | None) -> str:
    """`band: calibrated ±27% (why)`: the line under the headline table."""
    return f"band: {band.label()}: {band.why}" if band is not None else "band: none (no performance factors)"


def _span(band: Band | None, x: float, unit: str) -> str:
    return f"{band.low(x):,.1f}-{band.high(x):,.1f}{unit}" if band is not None else ""


class Shown(NamedTuple):
    """What a report shows of a prediction: a title, headline rows (figure, value, band, bound by), the band,
    notes, and tables of terms (title, terms)."""

    title: str
    rows: tuple[tuple[str, str, str, str], ...]
    band: Band | None
    notes: tuple[str, ...]
    sections: tuple[tuple[str, tuple[Term, ...]], ...]


def shown(p: Prediction | RolePrediction) -> Shown:
    """The headline and the terms of one deployment's prediction, or of a prefill/decode service's per role."""
    w, band = p.workload, p.band
    rows = (("TPOT (mean)", f"{_ms(p.tpot_s)} ms", _span(band, p.tpot_s * 1000, " ms")),
            ("ITL (mean)", f"{_ms(p.tpot_s)} ms", ""),
            ("output tok/s", f"{p.output_throughput:,.0f}", _span(band, p.output_throughput, "")),
            ("output tok/s per GPU", f"{p.output_throughput_per_gpu:,.1f}", _span(band, p.output_throughput_per_gpu,
                                                                                    "")))
    head = f"Predicted for {w.input_tokens:,} in / {w.output_tokens:,} out at concurrency {w.concurrency} (effort {w.effort}; "
    if isinstance(p, RolePrediction):
        pre, dec = p.prefill, p.decode
        bounds = (p.bound("tpot"), "as TPOT", p.bound("output_throughput"), f"over {p.gpus} GPUs of both roles")
        ttft = ("TTFT (mean)", f"{_ms(p.ttft_s)} ms" if p.ttft_s is not None else "not predicted", "",
                p.bound("ttft"))
        notes = (f"TTFT not predicted: {p.ttft_unknown}; its terms below leave the transfer out",) if p.ttft_unknown \
            else ()
        return Shown(
            head + f"{p.gpus} GPUs: {p.instances['prefill']} prefill x {pre.gpus} + {p.instances['decode']} decode x "
            f"{dec.gpus})", (ttft, *((*r, b) for r, b in zip(rows, bounds))), band, notes,
            (("TPOT (decode role)", p.tpot_terms),
             ("TTFT (prefill role, queue" + ("; the transfer not timed)" if p.ttft_unknown else ", transfer)"),
              p.ttft_terms),
             (f"decode role: decode step at batch {dec.running} (per GPU)", dec.decode.terms),
             (f"prefill role: prefill of {w.input_tokens:,} tokens (per GPU, one stage)", pre.prefill.terms)))
    bounds = (p.bound("tpot"), "as TPOT", p.bound("tpot"), f"over {p.gpus} GPUs")
    extra: list[str] = []
    if w.images and w.image_px is not None and w.text_tokens is not None:
        wpx, hpx = w.image_px
        extra.append(f"{w.input_tokens:,} in = {w.text_tokens:,} text + {w.images} image(s) of {wpx}x{hpx} px "
                     f"x {w.image_tokens:,} tokens each (its pads by the model's image processor, plus the media "
                     "markers around them)")
    if p.capped_by:
        extra.append(f"{p.running} requests run at once (capped by {p.capped_by}); the rest wait")
    return Shown(head + f"{p.gpus} GPUs)", (("TTFT (mean)", f"{_ms(p.ttft_s)} ms", "", p.bound("ttft")),
                                            *((*r, b) for r, b in zip(rows, bounds))), band, tuple(extra),
                 (("TPOT", p.tpot_terms), ("TTFT", p.ttft_terms),
                  (f"decode step at batch {p.running} (per GPU)", p.decode.terms),
                  (f"prefill of {w.input_tokens:,} tokens (per GPU, one stage)", p.prefill.terms)))


def prediction_renderable(p: Prediction | RolePrediction) -> Any:
    """Headline figures with their bounds, then every term of the decode step and the prefill."""
    from rich.console import Group
    from rich.text import Text

    from k3deploy.plan_report.report_tables import simple_table

    s = shown(p)
    parts: list[Any] = [
        simple_table(s.title, (("figure", "left"), ("value", "right"), ("band", "right"), ("bound by", "left")),
                     s.rows), Text(band_line(s.band), style="dim"), *(Text(n, style="yellow") for n in s.notes)]
    for title, terms in s.sections:
        parts.append(simple_table(title, (("term", "left"), ("ms", "right"), ("how", "left")),
                                  [(t.name, _ms(t.seconds), t.how) for t in terms]))
    parts.append(Text(FOOTNOTE, style="dim"))
    return Group(*parts)
