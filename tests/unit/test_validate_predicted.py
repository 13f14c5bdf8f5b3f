"""The effort stage's check of measured against predicted (validate/predicted.py), on summaries made from the
prediction itself: as predicted passes, a slow decode or a slow prefill fails naming that term, 0 turns it off,
a deployment inside the prediction's band passes however strict the share, the seed's H100 walkthrough passes at
its published figures, and a deployment the catalog cannot time is reported, not failed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.files import plan_path
from k3deploy.planning.prediction import predict_topology
from k3deploy.planning.workload import Workload
from k3deploy.validate.predicted import JUDGED_TTFT_MS, compare
from k3deploy.validate.stage import NodeRef, ValidateContext

pytestmark = pytest.mark.timeout(60)
DEMO = Path("topologies/local-demo.yaml")
PROMPTS = 8
H100 = Path("topologies/h100-4x8-sglang.yaml")


def context(share: float | None = None, catalog: Any = None, path: Path = DEMO, concurrency: int | None = None,
            env: dict[str, str] | None = None) -> ValidateContext:
    plan = plan_path(path, load_catalog()).plan
    assert plan is not None
    t = plan.topology
    if env is not None:
        t = t.model_copy(update={"engine": t.engine.model_copy(update={"env": env})})
    if concurrency is not None:
        t = t.model_copy(update={"validate_": t.validate_.model_copy(update={"concurrency": concurrency})})
    if share is not None:
        t = t.model_copy(update={"validate_": t.validate_.model_copy(update={"min_share_of_prediction": share})})
    return ValidateContext(name=t.name, topology=t, model=plan.model, nodes=[NodeRef(0, "localhost")],  # type: ignore[arg-type]
                           fleet=None, catalog=catalog)  # type: ignore[arg-type]


def summary(ctx: ValidateContext, *, tpot_x: float = 1.0, ttft_x: float = 1.0) -> dict[str, Any]:
    """What a run of the predicted workload would measure, with TPOT and TTFT stretched."""
    w = Workload(1000, 200, ctx.topology.validate_.concurrency, num_prompts=PROMPTS)
    f = predict_topology(ctx.topology, load_catalog(), w).bench_fields()
    latency = f["mean_ttft_ms"] * ttft_x + (w.output_tokens - 1) * f["mean_tpot_ms"] * tpot_x
    baseline = f["mean_ttft_ms"] + (w.output_tokens - 1) * f["mean_tpot_ms"]
    return {"completed": PROMPTS, "total_input_tokens": PROMPTS * w.input_tokens,
            "total_output_tokens": PROMPTS * w.output_tokens, "mean_tpot_ms": f["mean_tpot_ms"] * tpot_x,
            "mean_ttft_ms": f["mean_ttft_ms"] * ttft_x,
            "output_throughput": f["output_throughput"] * baseline / latency}


def test_as_predicted_passes_and_reports_the_prediction() -> None:
    ctx = context()
    problems, results, evidence = compare(ctx, summary(ctx), PROMPTS)
    assert problems == []
    assert results["share_of_predicted"] == pytest.approx({"output_throughput": 1, "decode": 1, "prefill": 1})
    assert results["predicted"]["bounds"]["tpot"] == "the decode step, bound by HBM reads"
    assert evidence.startswith("predicted for cold (1,000 in / 200 out, concurrency 8): ")


def test_a_slow_decode_fails_naming_the_decode_step() -> None:
    ctx = context()
    problems, results, _ = compare(ctx, summary(ctx, tpot_x=10), PROMPTS)
    assert len(problems) == 1 and results["share_of_predicted"]["decode"] == pytest.approx(0.1)
    assert problems[0].startswith("cold: far below the prediction for this shape (validate.min_share_of_prediction "
                                  "0.33, band derived ±10%: below 33% fails): the decode step runs at 10% of its "
                                  "predicted speed: mean TPOT ")
    assert problems[0].endswith(" predicted") and "; output " in problems[0]


def test_a_slow_prefill_fails_naming_the_prefill() -> None:
    ctx = context()
    problems, _, _ = compare(ctx, summary(ctx, ttft_x=200), PROMPTS)
    assert len(problems) == 1 and "the prefill runs at 0% of its predicted speed: mean TTFT" in problems[0]
    assert "(queue)" in problems[0] or "(the prefill" in problems[0]


def test_a_prefill_predicted_too_short_to_judge_is_not_judged() -> None:
    """Below JUDGED_TTFT_MS a TTFT is mostly HTTP and tokenizer cost: a short prompt's slow TTFT passes."""
    ctx = context()
    w = Workload(20, 200, ctx.topology.validate_.concurrency, num_prompts=PROMPTS)
    f = predict_topology(ctx.topology, load_catalog(), w).bench_fields()
    assert f["mean_ttft_ms"] < JUDGED_TTFT_MS
    slow = {"completed": PROMPTS, "total_input_tokens": PROMPTS * 20, "total_output_tokens": PROMPTS * 200,
            "mean_tpot_ms": f["mean_tpot_ms"], "mean_ttft_ms": f["mean_ttft_ms"] * 50,
            "output_throughput": f["output_throughput"] / 3}
    problems, results, _ = compare(ctx, slow, PROMPTS)
    assert problems == [] and results["share_of_predicted"]["prefill"] < 0.05


def test_within_the_share_passes_and_zero_turns_it_off() -> None:
    assert compare(context(), summary(context(), tpot_x=2.5), PROMPTS)[0] == []
    assert compare(context(share=0), summary(context(), tpot_x=100), PROMPTS)[0] == []


def test_what_cannot_be_predicted_is_said_not_failed() -> None:
    cat = load_catalog()
    bare = cat.model_copy(update={"performance": {}})
    ctx = context(catalog=bare)
    problems, results, evidence = compare(ctx, summary(context()), PROMPTS)
    assert problems == [] and evidence == ""
    assert results == {"prediction": "not compared: the catalog has no performance entry for engine kind 'sim'"}
    none_done = {**summary(context()), "completed": 0}
    assert compare(context(), none_done, PROMPTS)[1] == {"prediction": "not compared: no request completed"}


def test_a_deployment_inside_the_band_passes_however_strict_the_share() -> None:
    """On H100 the factors are extrapolated (band x2): at 60% of the predicted decode speed a deployment passes
    even with min_share_of_prediction 0.9; at 40% it fails, naming the decode step and the band."""
    def ctx() -> ValidateContext:
        return context(share=0.9, path=H100, concurrency=1, env={"NCCL_IB_DISABLE": "1"})

    assert compare(ctx(), summary(ctx(), tpot_x=1 / 0.6), PROMPTS)[0] == []
    problems = compare(ctx(), summary(ctx(), tpot_x=1 / 0.4), PROMPTS)[0]
    assert len(problems) == 1 and "band extrapolated x2: below 50% fails" in problems[0]
    assert "the decode step runs at 40% of its predicted speed" in problems[0]


@pytest.mark.parametrize(("concurrency", "tok_s"), [(1, 5.8), (4, 14.0)])
def test_the_h100_walkthrough_passes_at_its_published_figures(concurrency: int, tok_s: float) -> None:
    """The seed's reference (4 x 8 H100 TP32/EP32, NCCL over TCP sockets): 5.8 tok/s for one stream and 14.0 at
    concurrency 4, each stream decoding at tok_s / concurrency; TTFT as predicted (the walkthrough gives none)."""
    ctx = context(path=H100, concurrency=concurrency, env={"NCCL_IB_DISABLE": "1"})
    w = Workload(1000, 1000, concurrency, num_prompts=PROMPTS)
    f = predict_topology(ctx.topology, load_catalog(), w).bench_fields()
    measured = {"completed": PROMPTS, "total_input_tokens": PROMPTS * 1000, "total_output_tokens": PROMPTS * 1000,
                "mean_tpot_ms": 1000 * concurrency / tok_s, "mean_ttft_ms": f["mean_ttft_ms"], "output_throughput": tok_s}
    problems, results, _ = compare(ctx, measured, PROMPTS)
    assert problems == [], problems
    assert results["predicted"]["band"]["kind"] == "extrapolated"
