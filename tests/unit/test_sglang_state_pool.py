"""The planner's SGLang KDA state pool against SGLang's own sizing, re-derived here from the engine's source
rather than from planning/memory.py, so a drift in either shows; and against the admission caps the published
B300 TP8 + DCP8 servers (v0.5.18 @ 71de97b2) reported.

Source (sgl-project/sglang, python/sglang/srt/mem_cache/kv_cache_configurator.py, KVCacheConfigurator, at
003fca80): `_profile_available_bytes`: rest = free after load - free before load x (1 - mem_fraction_static), i.e.
usable x mem_fraction - weights; `_handle_max_mamba_cache`, ratio branch: budget = rest x r / (1 + r); with
speculation and no ReplaySSM, max_mamba_cache_size = budget // (per_req x (1 + D / ratio)) plus D intermediate
states for min(max_running_requests, size // ratio) requests; with `--enable-linear-replayssm-spec` on a KDA model
(replayssm_active) no intermediate states, and size = budget // (per_req + ring bytes); `resolve_max_num_reqs`:
requests = min(max_running_requests, size // ratio); `_calculate_mamba_ratio`: ratio =
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (3) + MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP (2) with the overlap
scheduler, which speculation keeps (arg_groups/speculative_hook.py at 004c82e0: `_handle_dspark` never sets
disable_overlap_schedule; SGLANG_ENABLE_SPEC_V2 is gone, spec always runs the V2 worker). D =
speculative_num_draft_tokens = gamma + 1 (`_handle_dspark`). The ring: test_replayssm_ring_accounting.py
test_kda_fold (raw v, pre-norm k, d, k in the conv dtype, the per-key gate g in FP32, beta in FP32, per head per
record). The measured caps: docs/cookbook/autoregressive/Moonshotai/Kimi-K3.mdx, "101 / 68 / 91 / 60 concurrent
requests for MXFP4 NOSPEC / MXFP4 DSPARK / NVFP4 NOSPEC / NVFP4 DSPARK", the cookbook's DSPARK recipe carrying
--enable-linear-replayssm-spec (docs/src/snippets/configs/moonshotai/kimi-k3.jsx). The static share the pools come
from: `_profile_available_bytes` charges everything resident at profiling time (weights and all else) against
free-before-load x mem_fraction_static; the catalog's kimi-k3 sglang_static_overhead_gib is that "all else" less
the vision tower, which SGLang keeps whole on every rank (models/kimi_k3.py @e44a41c1) and the budget counts apart
(its vision line: the tower less the non-expert line's tower / attn_tp)."""
from __future__ import annotations

from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.memory import MemoryBudget, kda_replay_ring_bytes
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(60)
GIB = 1 << 30
BASE_RATIO, OVERLAP_EXTRA = 3, 2  # kv_cache_configurator.py module constants
DSPARK7 = {"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}
REPLAY = {**DSPARK7, "--enable-linear-replayssm-spec": True}
MEASURED_NOSPEC, MEASURED_DSPARK = 101, 68  # Kimi-K3.mdx: MXFP4 Balanced (TP8 + DCP8) admission caps


def _b300_dcp8(args: dict[str, Any]) -> MemoryBudget:
    # The published servers ran the SGLang cookbook's generated command, whose ratio its K3 calculator computes.
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, tp=8, ep=1, dcp=8, max_running_requests=256,
                        mamba_full_memory_ratio="calculator")
    doc["engine"]["args"] = args
    return plan_of(doc).memory


def sglang_state_requests(m: MemoryBudget, ratio: int, draft_tokens: int, ring: int = 0) -> int:
    """Requests SGLang's state pool admits, by the source's formula, from the same cache and pool split."""
    rest = m.kv_pool_bytes + m.state_pool_bytes  # usable x mem_fraction - weights - engine static memory
    assert m.pool_ratio is not None
    budget = rest * m.pool_ratio / (1 + m.pool_ratio)
    per_req = m.kda_state_bytes_per_slot
    size = int(budget // (per_req * (1 + draft_tokens / ratio))) if draft_tokens else int(budget // (per_req + ring))
    return size // ratio


def test_the_catalogs_slots_are_sglangs_ratio_with_the_overlap_scheduler() -> None:
    sglang = load_catalog().engines["sglang"]
    assert sglang.slots_per_request["extra_buffer"] == BASE_RATIO + OVERLAP_EXTRA
    assert sglang.slots_per_request["no_buffer"] == BASE_RATIO


def test_the_replay_ring_is_sglangs_kda_record_layout() -> None:
    """SGLang's own accounting test: 4 heads, head_dim 8, 8 records, 2 layers, BF16 conv: 3200 B a layer."""
    ring = load_catalog().engines["sglang"].replay_ring
    assert ring is not None and ring.flag == "--enable-linear-replayssm-spec"
    arch = load_catalog().models["kimi-k3"].architecture.model_copy(update={"kda_num_heads": 4, "kda_head_dim": 8})
    assert kda_replay_ring_bytes(arch, 1, ring, 8, "bf16", kda_layers=2) == 3200 * 2


@pytest.mark.parametrize(("args", "drafts", "replay"), [({}, 0, False), (DSPARK7, 8, False), (REPLAY, 0, True)],
                         ids=["nospec", "dspark7", "dspark7-replayssm"])
def test_the_state_pool_admits_what_sglangs_formula_admits(args: dict[str, Any], drafts: int, replay: bool) -> None:
    m = _b300_dcp8(args)
    assert m.draft_slots == drafts  # gamma + 1 = 8 verify states a request, none with ReplaySSM
    assert (m.replay_ring_bytes_per_slot > 0) == replay
    assert m.state_requests == sglang_state_requests(m, BASE_RATIO + OVERLAP_EXTRA, drafts,
                                                     m.replay_ring_bytes_per_slot)


def test_the_measured_servers_admission_is_replayssms_not_thirteen_slots() -> None:
    """The published servers admitted 101 (NOSPEC) and 68 (DSPARK + ReplaySSM) requests: a ratio of 1.49. The
    ReplaySSM rule gives the same ratio within 3%; 13 slots a request (no ReplaySSM) would give 2.5, so the
    c64 DSPARK run was never capped."""
    nospec, replay, thirteen = _b300_dcp8({}), _b300_dcp8(REPLAY), _b300_dcp8(DSPARK7)
    measured = MEASURED_NOSPEC / MEASURED_DSPARK
    assert nospec.state_requests / replay.state_requests == pytest.approx(measured, rel=0.03)
    assert nospec.state_requests / thirteen.state_requests > 2 > measured
    assert replay.state_requests >= 64 > thirteen.state_requests


@pytest.mark.parametrize(("args", "measured"), [({}, MEASURED_NOSPEC), (REPLAY, MEASURED_DSPARK)],
                         ids=["nospec", "dspark7-replayssm"])
def test_the_state_pool_admits_what_the_measured_servers_admitted(args: dict[str, Any], measured: int) -> None:
    """Within 10% of each published cap: SGLang sizes its pools from the static share less everything resident
    when it profiles (kv_cache_configurator.py _profile_available_bytes), not less the weights alone; counting
    the weights alone gave 154 and 105, 52% and 54% high."""
    m = _b300_dcp8(args)
    assert m.state_requests == pytest.approx(measured, rel=0.10), (m.state_requests, measured)
    assert m.engine_static_bytes == round(load_catalog().model("kimi-k3").sglang_static_overhead_gib * GIB)
    # The share is of what was free before the load; what was resident then is not charged to the pools again.
    # The replicated tower at attn_tp 8: 802,000,000 B less the non-expert line's 802,000,000 / 8 = 701,750,000 B.
    assert m.vision_bytes == 802_000_000 - 802_000_000 // 8 == 701_750_000
    assert m.kv_pool_bytes + m.state_pool_bytes == int((m.usable_bytes - m.engine_preload_bytes) * m.mem_fraction
                                                       - m.weights_bytes
                                                       - (m.engine_static_bytes - m.engine_preload_bytes)
                                                       - m.vision_bytes)


def test_the_engine_static_memory_is_what_the_h100_reference_split_leaves() -> None:
    """The second measurement the catalog's figure is the mean of, on other hardware: the reference TP32 split on
    H100 (KV 3.62 + KDA state 3.40 GiB, tests/unit/test_planner_reference.py) leaves 14.9 GiB of SGLang's 0.85
    share beyond the weights and both pools, within 1 GiB of what the pools are charged at that fraction (the
    B300 cap alone needs 15.6-15.8): the part resident after the load, and the share of what was resident
    before it."""
    m = plan_of(topology_dict()).memory
    assert m is not None and m.mem_fraction == 0.85
    left = m.usable_bytes * m.mem_fraction - m.weights_bytes - (3.62 + 3.40) * GIB
    charged = (m.engine_static_bytes - m.engine_preload_bytes + m.mem_fraction * m.engine_preload_bytes
               + m.vision_bytes)
    assert abs(left - charged) < GIB, (left / GIB, charged / GIB)
