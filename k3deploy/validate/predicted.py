"""The effort stage's measured-against-predicted check: the cold workload's figures beside what the planner's
performance model predicts for the deployed shape at the same prompt and answer lengths and concurrency; a
decode (1/TPOT) or a prefill (1/TTFT, when the predicted TTFT is long enough to judge) far slower than
predicted fails, naming that term."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from k3deploy.validate.stage import ValidateContext

if TYPE_CHECKING:
    from k3deploy.planning.perf_band import Band
    from k3deploy.planning.workload import Workload

T = TypeVar("T")

JUDGED_TTFT_MS = 100.0


def judged_share(share: float, band: Band | None) -> float:
    """The share of the predicted speed below which a figure fails: the topology's min_share_of_prediction,
    lowered to the prediction band's lower edge where that is wider (a deployment inside the published spread
    passes); 0 (the check off) stays 0."""
    if not share or band is None:
        return share
    return min(share, 1 / (1 + band.rel))


def band_note(band: Band | None) -> str:
    """`, band calibrated ±27%` for a problem line ('' without a band)."""
    return f", band {band.label()}" if band is not None else ""


def predicted(ctx: ValidateContext, summary: dict[str, Any], prompts: int,
              predict: Callable[[Workload], T]) -> tuple[Workload, T] | dict[str, Any]:
    """The cold run's workload, as the planner's model takes it, and `predict` of it; or the results saying why
    nothing was compared (no request completed; PerfUnknown)."""
    from k3deploy.planning.perf_model import PerfUnknown
    from k3deploy.planning.workload import Workload

    done = summary["completed"]
    if not done or not summary["total_output_tokens"]:
        return {"prediction": "not compared: no request completed"}
    w = Workload(input_tokens=max(1, round(summary["total_input_tokens"] / done)),
                 output_tokens=max(2, round(summary["total_output_tokens"] / done)),
                 concurrency=ctx.topology.validate_.concurrency, effort=ctx.topology.serving.reasoning_effort,
                 num_prompts=prompts)
    try:
        return w, predict(w)
    except PerfUnknown as exc:
        return {"prediction": f"not compared: {exc}"}


def compare(ctx: ValidateContext, summary: dict[str, Any], prompts: int) -> tuple[list[str], dict[str, Any], str]:
    """(problems, results, evidence line) of the cold workload against its prediction."""
    from k3deploy.catalog.loader import load_catalog
    from k3deploy.planning.prediction import predict_topology

    settings = ctx.topology.validate_
    got = predicted(ctx, summary, prompts, lambda w: predict_topology(ctx.topology, ctx.catalog or load_catalog(), w))
    if isinstance(got, dict):
        return [], got, ""
    w, p = got
    fields = p.bench_fields()
    # Speeds as shares of the prediction: below 1 is slower than predicted.
    speed = {"output_throughput": summary["output_throughput"] / fields["output_throughput"],
             "decode": fields["mean_tpot_ms"] / max(summary["mean_tpot_ms"], 1e-9),
             "prefill": fields["mean_ttft_ms"] / max(summary["mean_ttft_ms"], 1e-9)}
    results = {"predicted": {k: fields[k] for k in ("output_throughput", "output_throughput_per_gpu",
                                                    "mean_tpot_ms", "mean_ttft_ms")}
               | {"bounds": {"tpot": p.bound("tpot"), "ttft": p.bound("ttft")}, "workload": w.model_dump(),
                  "band": p.band.model_dump() if p.band is not None else None},
               "share_of_predicted": speed}
    evidence = (f"predicted for cold ({w.input_tokens:,} in / {w.output_tokens:,} out, concurrency "
                f"{w.concurrency}): {fields['output_throughput']:,.0f} tok/s out, TPOT {fields['mean_tpot_ms']:.1f} ms "
                f"({p.bound('tpot')}), TTFT {fields['mean_ttft_ms']:,.0f} ms ({p.bound('ttft')})")
    share = judged_share(settings.min_share_of_prediction, p.band)
    slow_decode = speed["decode"] < share
    # Below this a TTFT is mostly the HTTP, tokenizer and scheduling cost every engine adds to the GPU time
    # the model predicts: such a prefill is not judged (a real K3 prefill of 8k tokens takes ~370 ms).
    slow_prefill = speed["prefill"] < share and fields["mean_ttft_ms"] >= JUDGED_TTFT_MS
    if not share or not (slow_decode or slow_prefill):
        return [], results, evidence
    if slow_decode and speed["decode"] <= speed["prefill"] or not slow_prefill:
        term = (f"the decode step runs at {speed['decode']:.0%} of its predicted speed: mean TPOT "
                f"{summary['mean_tpot_ms']:,.1f} ms against {fields['mean_tpot_ms']:,.1f} ms predicted "
                f"({p.bound('tpot')})")
    else:
        term = (f"the prefill runs at {speed['prefill']:.0%} of its predicted speed: mean TTFT "
                f"{summary['mean_ttft_ms']:,.0f} ms against {fields['mean_ttft_ms']:,.0f} ms predicted "
                f"({p.bound('ttft')})")
    problem = (f"cold: far below the prediction for this shape (validate.min_share_of_prediction "
               f"{settings.min_share_of_prediction:g}{band_note(p.band)}: below {share:.0%} fails): "
               f"{term}; output {summary['output_throughput']:,.0f} tok/s against "
               f"{fields['output_throughput']:,.0f} predicted")
    return [problem], results, evidence
