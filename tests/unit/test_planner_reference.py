"""The planner reproduces every number the reference arithmetic asserts."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.shape import make_shape
from k3deploy.planning import rules
from k3deploy.planning.files import plan_path
from k3deploy.planning.memory import (
    kda_state_bytes_per_slot,
    mla_kv_bytes_per_token,
    sglang_pool_ratio,
    unaccounted_bytes,
    vllm_block_tokens,
    weights_bytes_per_gpu,
)
from tests.unit.plan_helpers import codes, plan_of, topology_dict

pytestmark = pytest.mark.timeout(60)
GIB = 1 << 30
ARCH = load_catalog().model("kimi-k3").architecture


def test_legal_tp_set() -> None:
    legal = [tp for tp in range(1, 97) if not list(rules.tp_divisibility(ARCH, tp))]
    assert legal == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("tp", [3, 6, 12, 24, 48])
def test_tp_with_factor_three_fails_on_hidden(tp: int) -> None:
    msgs = [i.message for i in rules.tp_divisibility(ARCH, tp)]
    assert f"tp={tp} does not divide hidden 7168 = 2^10 x 7" in msgs


def test_tp64_fails_on_heads_and_tp96_on_hidden() -> None:
    assert "tp=64 does not divide attention heads 96 = 2^5 x 3" in [i.message for i in rules.tp_divisibility(ARCH, 64)]
    msgs96 = [i.message for i in rules.tp_divisibility(ARCH, 96)]
    assert any("hidden 7168" in m for m in msgs96) and not any("attention heads" in m for m in msgs96)


def test_only_tp32_fits_h100_with_reserve() -> None:
    fits = []
    for tp in (1, 2, 4, 8, 16, 32):
        per_node = min(tp, 8)
        plan = plan_of(topology_dict(tp=tp, ep=tp, nodes=tp // per_node, per_node=per_node))
        if "MEM_WEIGHTS" not in codes(plan):
            fits.append(tp)
    assert fits == [32]


@pytest.mark.parametrize(("tp", "gib"), [(16, 90.86), (32, 45.43)])
def test_weights_per_gpu(tp: int, gib: float) -> None:
    plan = plan_of(topology_dict(tp=tp, ep=tp, nodes=tp // 8))
    assert plan.memory is not None
    # The reference rounds the payload to 1453.7 GiB before dividing; exact bytes agree to 0.01 GiB.
    assert abs(plan.memory.weights_bytes / GIB - gib) < 0.01
    assert abs(plan.memory.weights_bytes - load_catalog().model("kimi-k3").weights.total_bytes / tp) < 2


def test_tp16_message_names_the_shortfall() -> None:
    plan = plan_of(topology_dict(tp=16, ep=16, nodes=2))
    msg = next(i for i in plan.issues if i.code == "MEM_WEIGHTS").message
    assert "weights 90.85 GiB + reserve 8.00 GiB" in msg and "exceed usable 79.19 GiB" in msg and "by 19.66 GiB" in msg


def test_experts_per_rank_and_ep48() -> None:
    plan = plan_of(topology_dict())
    assert plan.shape is not None and plan.shape.experts_per_rank == 28
    bad = plan_of(topology_dict(tp=48, ep=48, nodes=6))
    assert "EP_EXPERTS" in codes(bad)
    assert any("ep=48 does not divide routed experts 896 = 2^7 x 7" in i.message for i in bad.issues)


def test_reported_budget_leaves_16_4_gib_unaccounted() -> None:
    usable = load_catalog().gpu("h100-80gb").usable_bytes
    reported = {"weights": 45.43, "mla_kv": 3.62, "kda_state": 3.40, "headroom": 10.34}
    assert round(sum(reported.values()), 2) == 62.79
    left = unaccounted_bytes(usable, {k: v * GIB for k, v in reported.items()})
    assert round(left / GIB, 1) == 16.4


def test_kda_state_and_mla_kv_bytes() -> None:
    assert kda_state_bytes_per_slot(ARCH, 8, "fp32") == 56_171_520
    assert kda_state_bytes_per_slot(ARCH, 16, "fp32") == 28_085_760
    assert kda_state_bytes_per_slot(ARCH, 32, "fp32") == 14_042_880
    assert mla_kv_bytes_per_token(ARCH, "bf16") == 27_648
    assert mla_kv_bytes_per_token(ARCH, "fp8") == 13_824
    assert mla_kv_bytes_per_token(ARCH, "bf16", dcp=16) == 27_648 / 16


def test_vllm_block_size_tp8_fp8() -> None:
    per_layer_state = kda_state_bytes_per_slot(ARCH, 8, "fp32") / 69
    per_layer_kv = mla_kv_bytes_per_token(ARCH, "fp8") / 24
    assert vllm_block_tokens(per_layer_state, per_layer_kv, 128) == 1536


def test_sglang_pool_ratio_formula() -> None:
    """The SGLang K3 calculator's ratio, used when the topology asks for it ('calculator')."""
    r = sglang_pool_ratio(5, 14_042_880, 27_648, 11264)
    assert r == pytest.approx(5 * 14_042_880 / (11264 * 27_648))
    plan = plan_of(topology_dict(mamba_full_memory_ratio="calculator"))
    assert plan.memory is not None and plan.memory.pool_ratio == pytest.approx(r)
    m = plan.memory
    assert m.state_pool_bytes / m.kv_pool_bytes == pytest.approx(r, rel=1e-6)


def test_unset_ratio_is_sglangs_own_default() -> None:
    """No --mamba-full-memory-ratio in the command: SGLang splits by its default 0.9 (the catalog's)."""
    m = plan_of(topology_dict()).memory
    assert m is not None and m.pool_ratio == load_catalog().engines["sglang"].mamba_full_memory_ratio_default == 0.9
    assert m.state_pool_bytes / m.kv_pool_bytes == pytest.approx(0.9, rel=1e-6)


# Seed 000 ("The memory budget, and the 16.4 GiB you should expect to lose"): the reported per-GPU split of the
# published walkthrough on 32 x H100-80GB, TP32 / EP32, --mem-fraction-static 0.85, and "Reported concurrency tops
# out around 49 requests in that walkthrough's configuration".
COOKBOOK_SPLIT_GIB = {"weights": 45.43, "mla_kv_cache": 3.62, "kda_recurrent_state": 3.40}
COOKBOOK_CONCURRENCY = 49


def test_the_reference_topology_plans_the_cookbooks_split() -> None:
    """topologies/h100-4x8-sglang.yaml, the cookbook's own command: each pool within 10% of seed 000's line, and
    the state pool admits about the 49 requests it reports (47: SGLang's own default ratio, no cap rendered)."""
    plan = plan_path(Path("topologies/h100-4x8-sglang.yaml"), load_catalog()).plan
    assert plan is not None and plan.feasible and plan.memory is not None and plan.capacity is not None
    m = plan.memory
    got = {"weights": m.weights_bytes / GIB, "mla_kv_cache": m.kv_pool_bytes / GIB,
           "kda_recurrent_state": m.state_pool_bytes / GIB}
    for line, gib in COOKBOOK_SPLIT_GIB.items():
        assert got[line] == pytest.approx(gib, rel=0.10), (line, got[line], gib)
    assert plan.capacity.max_running_requests == pytest.approx(COOKBOOK_CONCURRENCY, rel=0.10)
    assert "CONCURRENCY_CAPPED" not in {i.code for i in plan.issues}


@pytest.mark.parametrize("kind, gpu, per_node, nodes, tp, ep, dp, model", [
    ("sglang", "h100-80gb", 8, 4, 32, 32, 1, "kimi-k3"),
    ("vllm", "b200", 8, 2, 8, 16, 2, "kimi-k3"),
    ("vllm-ascend", "ascend-a3", 16, 4, 16, 64, 4, "kimi-k3-w4a8"),
])
def test_budget_lines_recomputed_from_the_catalog(kind: str, gpu: str, per_node: int, nodes: int, tp: int, ep: int,
                                                  dp: int, model: str) -> None:
    cat = load_catalog()
    plan = plan_of(topology_dict(kind=kind, gpu=gpu, per_node=per_node, nodes=nodes, tp=tp, ep=ep, dp=dp,
                                 model=model))
    m = plan.memory
    assert m is not None and plan.shape is not None
    hw = cat.gpu(gpu)
    usable = hw.usable_bytes
    reserve_gib = hw.runtime_reserve_gib if hw.runtime_reserve_gib is not None else cat.planner.runtime_reserve_gib
    reserve = round(reserve_gib * GIB)
    routed, rest = weights_bytes_per_gpu(cat.model(model), plan.shape)
    # SGLang's static fraction is of what was free before the load (usable less what was resident then) and holds
    # the weights, what else the engine holds when it sizes its pools, and both pools (the reserve lies outside
    # it); vLLM's memory utilization holds the reserve too, so the headroom is what lies outside the fraction
    # either way.
    spec = cat.model(model)
    static = round((spec.sglang_static_overhead_gib or 0) * GIB) if kind == "sglang" else 0
    preload = round((spec.sglang_preload_overhead_gib or 0) * GIB) if kind == "sglang" else 0
    assert (kind == "sglang") == (static > 0) == (preload > 0)
    share = (usable - preload) * cat.engines[kind].default_mem_fraction
    # The vision tower beyond the non-expert line's tower / attn_tp: SGLang keeps it whole on every rank; vLLM (and
    # vLLM-Ascend) whole where TP does not divide its heads, and its profile run holds one largest image's
    # embeddings (max_image_tokens x hidden size x BF16) at the default batch.
    v, arch = spec.vision, spec.architecture
    assert v is not None
    tower = v.params * 2
    counted = -(-tower // plan.shape.attn_tp)
    held = tower if kind == "sglang" or v.num_heads % tp else -(-tower // tp)
    vision = held - counted + (0 if kind == "sglang" else v.max_image_tokens * arch.hidden_size * 2)
    cache = share - routed - rest - (static - preload) - (0 if kind == "sglang" else reserve) - vision
    assert m.vision_bytes == vision
    assert (m.usable_bytes, m.weights_bytes, m.reserve_bytes) == (usable, routed + rest, reserve)
    assert (m.engine_static_bytes, m.engine_preload_bytes) == (static, preload)
    assert m.kv_pool_bytes + m.state_pool_bytes == int(cache)
    assert m.headroom_bytes == pytest.approx(usable - preload - share - (reserve if kind == "sglang" else 0), abs=1)
    assert m.headroom_bytes >= 0
    assert (m.weights_bytes + m.reserve_bytes + m.engine_static_bytes + m.vision_bytes + m.kv_pool_bytes
            + m.state_pool_bytes + m.headroom_bytes) == usable


def test_hopper_bf16_upcast_is_over_3_5x() -> None:
    model = load_catalog().model("kimi-k3")
    shape = make_shape("sglang", tp=32, ep=32, dp=1, pp=1, dcp=1, attention_dp=False, nnodes=4, gpus_per_node=8,
                       num_experts=896)
    packed, _ = weights_bytes_per_gpu(model, shape)
    upcast, _ = weights_bytes_per_gpu(model, shape, experts_bf16=True)
    assert upcast / packed > 3.5
    assert upcast + 8 * GIB > load_catalog().gpu("h100-80gb").usable_bytes
