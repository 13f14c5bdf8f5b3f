"""The speculative draft's cost (planning/draft_cost.py and the memory budget): its weights, passes, KV and extra
KDA state slots are counted, shown as their own term, and decide against speculation where they should."""
from __future__ import annotations

import math
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import ModelSpec
from k3deploy.engines.shape import make_shape
from k3deploy.planning.draft_cost import draft_cost
from k3deploy.planning.perf_model import PerfInputs, PerfUnknown
from k3deploy.planning.prediction import Prediction, predict
from k3deploy.planning.speculation import acceptance
from k3deploy.planning.workload import Workload
from tests.unit.plan_helpers import plan_of, topology_dict
from tests.unit.test_plan_cli import k3

pytestmark = pytest.mark.timeout(120)
DSPARK7 = {"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}
CAT = load_catalog()
K3 = CAT.models["kimi-k3"]


def _b300_dcp8_plan(args: dict[str, Any]) -> Any:
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, tp=8, ep=1, dcp=8, max_running_requests=64)
    doc["engine"]["args"] = args
    return plan_of(doc)


def _inputs(model: ModelSpec, drafts: int, draft_kv: float) -> PerfInputs:
    shape = make_shape("sglang", tp=8, ep=1, dp=1, pp=1, dcp=8, attention_dp=False, nnodes=1, gpus_per_node=8,
                       num_experts=model.architecture.num_experts)
    return PerfInputs(model=model, hw=CAT.hardware["b300"], shape=shape, perf=CAT.performance["sglang"],
                      family="sglang", kv_dtype="bf16", ssm_dtype="fp32", drafts=drafts,
                      accepted=acceptance(model, drafts), draft_kv_bytes_per_token=draft_kv)


def _free_draft() -> ModelSpec:
    """K3 with a draft that reads and computes nothing (what the model predicted before the draft was counted)."""
    assert K3.draft is not None
    return K3.model_copy(update={"draft": K3.draft.model_copy(
        update={"weights_bytes": 0, "num_layers": 0, "shares_lm_head": False})})


def test_the_memory_budget_holds_the_drafts_weights_kv_and_state_slots() -> None:
    plain, spec = _b300_dcp8_plan({}).memory, _b300_dcp8_plan(DSPARK7).memory
    assert K3.draft is not None and plain.draft_weights_bytes == 0
    assert spec.draft_weights_bytes == math.ceil(K3.draft.weights_bytes / 8)
    assert spec.weights_bytes == plain.weights_bytes + spec.draft_weights_bytes
    assert spec.slots_per_request == plain.slots_per_request + 8 and spec.draft_slots == 8  # block 7 + 1
    assert spec.draft_kv_bytes_per_token == CAT.engines["sglang"].draft_kv_bytes_per_token
    assert spec.kv_tokens == spec.kv_pool_bytes // (spec.mla_kv_bytes_per_token + spec.draft_kv_bytes_per_token)
    assert spec.state_requests < plain.state_requests  # 13 slots a request instead of 5
    lines = [spec.routed_weights_bytes, spec.non_expert_weights_bytes, spec.draft_weights_bytes, spec.reserve_bytes,
             spec.engine_static_bytes, spec.vision_bytes, spec.kv_pool_bytes, spec.state_pool_bytes,
             spec.headroom_bytes]
    assert sum(lines) == spec.usable_bytes


def test_the_draft_term_is_what_speculation_adds_to_the_step() -> None:
    w = Workload(8192, 1024, 16)
    kv = float(CAT.engines["sglang"].draft_kv_bytes_per_token or 0)
    costed, free = predict(_inputs(K3, 7, kv), w), predict(_inputs(_free_draft(), 7, 0), w)
    term = next(t for t in costed.decode.terms if t.name == "draft model")
    cost = draft_cost(_inputs(K3, 7, kv), 16, 8192 + 512)
    assert term.seconds == pytest.approx(cost.seconds) and costed.decode.draft_s == pytest.approx(cost.seconds)
    assert costed.tpot_s - free.tpot_s == pytest.approx(cost.seconds / acceptance(K3, 7), rel=0.02)
    assert cost.reads_s > 0 and cost.compute_s > 0 and cost.collectives_s > 0 and cost.overhead_s > 0
    assert all(t.name != "draft model" for t in predict(_inputs(K3, 0, kv), w).decode.terms)


def test_a_model_without_a_draft_in_the_catalog_cannot_be_timed_speculating() -> None:
    with pytest.raises(PerfUnknown, match="has no `draft` in the catalog"):
        predict(_inputs(K3.model_copy(update={"draft": None}), 7, 0), Workload(1024, 128, 1))


def _flip(concurrency: int) -> tuple[Prediction, Prediction, Prediction]:
    w = Workload(1024, 1024, concurrency)
    kv = float(CAT.engines["sglang"].draft_kv_bytes_per_token or 0)
    return predict(_inputs(K3, 0, 0), w), predict(_inputs(K3, 7, kv), w), predict(_inputs(_free_draft(), 7, 0), w)


def test_the_drafts_cost_makes_no_speculation_win_where_the_step_is_compute_bound() -> None:
    """Scanning concurrency (caches not capping): at low concurrency DSPARK wins even with its draft counted;
    where the verify step is compute-bound there are concurrencies at which speculation would still win if the
    draft were free, and no speculation wins once the draft's passes are counted."""
    low_plain, low_spec, _ = _flip(16)
    assert low_spec.output_throughput_per_gpu > low_plain.output_throughput_per_gpu
    flips = []
    for c in range(64, 1025, 16):
        plain, costed, free = _flip(c)
        if free.output_throughput_per_gpu > plain.output_throughput_per_gpu > costed.output_throughput_per_gpu:
            flips.append(c)
            assert costed.decode.bound == "compute", c
    assert flips, "no concurrency where the draft's cost decides for no speculation"


def test_plan_workload_shows_the_draft_term(tmp_path: Any) -> None:
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, tp=8, ep=1, max_running_requests=16,
                        context_length=16384)
    doc["engine"]["args"] = DSPARK7
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(doc))
    out = k3("plan", str(f), "--workload", "in=8192,out=1024,concurrency=16").stdout
    assert "draft model" in out and "1 pass of 5 layers x 8 positions" in out
    assert "weights: draft model" in out and "(8 for the draft)" in out
