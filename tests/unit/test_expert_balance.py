"""Expert parallelism's per-rank imbalance (planning/expert_balance.py): TP8/EP8 and TP8 on one node differ
where a decode step touches few experts, and agree where it touches them all."""
from __future__ import annotations

import itertools
import math

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.shape import make_shape
from k3deploy.planning.expert_balance import expected_max_binomial, slowest_rank_share
from k3deploy.planning.perf_model import PerfInputs, decode_step

pytestmark = pytest.mark.timeout(60)
CAT = load_catalog()


def test_expected_max_matches_enumeration() -> None:
    n, p, ranks = 5, 0.3, 3
    pmf = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]
    exact = sum(max(ks) * math.prod(pmf[k] for k in ks) for ks in itertools.product(range(n + 1), repeat=ranks))
    assert expected_max_binomial(n, p, ranks) == pytest.approx(exact, rel=1e-9)
    assert expected_max_binomial(n, p, 1) == pytest.approx(n * p)


def _step(ep: int, batch: int) -> tuple[float, float]:
    model = CAT.models["kimi-k3"]
    shape = make_shape("sglang", tp=8, ep=ep, dp=1, pp=1, dcp=1, attention_dp=False, nnodes=1, gpus_per_node=8,
                       num_experts=model.architecture.num_experts)
    inp = PerfInputs(model=model, hw=CAT.hardware["b300"], shape=shape, perf=CAT.performance["sglang"],
                     family="sglang", kv_dtype="bf16", ssm_dtype="fp32")
    step = decode_step(inp, batch, 8704)
    return step.seconds, step.reads_s


def test_tp8_ep8_reads_the_slowest_ranks_experts_at_low_batch() -> None:
    (tp_s, tp_reads), (ep_s, ep_reads) = _step(1, 1), _step(8, 1)
    touched = 16 / 896  # one token: each expert touched with probability k / E
    skew = slowest_rank_share(896, 8, touched)
    assert skew > 1.5  # the busiest of 8 ranks holds about twice the mean rank's 2 touched experts
    model = CAT.models["kimi-k3"]
    extra = model.weights.routed_expert_bytes / 8 * touched * (skew - 1)  # one stage: every layer
    bw = CAT.hardware["b300"].bandwidth_tbps * 1e12 * CAT.performance["sglang"].hbm_efficiency
    assert ep_reads - tp_reads == pytest.approx(extra / bw, rel=1e-6)
    assert ep_s > tp_s


def test_tp8_ep8_and_tp8_agree_when_the_batch_touches_every_expert() -> None:
    (tp_s, _), (ep_s, _) = _step(1, 512), _step(8, 512)
    assert ep_s == pytest.approx(tp_s, rel=0.01)
