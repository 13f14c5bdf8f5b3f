"""The planner's SGLang KDA state pool against SGLang's own sizing, re-derived here from the engine's source
rather than from planning/memory.py, so a drift in either shows; and the arithmetic behind the one pinned
ranking disagreement (b300 TP8 + DCP8, DSPARK block 7, 64 requests).

Source (sgl-project/sglang, python/sglang/srt/mem_cache/kv_cache_configurator.py, KVCacheConfigurator):
`_profile_available_bytes`: rest = free after load - free before load x (1 - mem_fraction_static), i.e.
usable x mem_fraction - weights; `_handle_max_mamba_cache`, ratio branch with speculation:
budget = rest x r / (1 + r), max_mamba_cache_size = budget // (per_req x (1 + D / ratio)), intermediate states
for min(max_running_requests, size // ratio) requests x D; `_resolve_max_num_reqs`: requests =
min(max_running_requests, max_mamba_cache_size // ratio); `_calculate_mamba_ratio`: ratio =
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO (3) + MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP (2) with the overlap
scheduler, + MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP (1) without it. D = speculative_num_draft_tokens, which
python/sglang/srt/arg_groups/speculative_hook.py `_handle_dspark` (at 004c82e0) sets to gamma + 1."""
from __future__ import annotations

from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.memory import MemoryBudget
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(60)
BASE_RATIO, OVERLAP_EXTRA, NO_OVERLAP_EXTRA = 3, 2, 1  # kv_cache_configurator.py module constants
DSPARK7 = {"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}
REQUEST_TOKENS = 8192 + 1024  # the published c64 runs: 8k in, 1k out


def _b300_dcp8(args: dict[str, Any]) -> MemoryBudget:
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, tp=8, ep=1, dcp=8, max_running_requests=64)
    doc["engine"]["args"] = args
    return plan_of(doc).memory


def sglang_state_requests(m: MemoryBudget, ratio: int, draft_tokens: int) -> int:
    """Requests SGLang's state pool admits, by the source's formula, from the same cache and pool split."""
    rest = m.kv_pool_bytes + m.state_pool_bytes  # usable x mem_fraction - weights
    assert m.pool_ratio is not None
    budget = rest * m.pool_ratio / (1 + m.pool_ratio)
    per_req = m.kda_state_bytes_per_slot
    size = int(budget // (per_req * (1 + draft_tokens / ratio))) if draft_tokens else int(budget // per_req)
    return size // ratio


def test_the_catalogs_slots_are_sglangs_ratio_with_the_overlap_scheduler() -> None:
    sglang = load_catalog().engines["sglang"]
    assert sglang.slots_per_request["extra_buffer"] == BASE_RATIO + OVERLAP_EXTRA
    assert sglang.slots_per_request["no_buffer"] == BASE_RATIO


@pytest.mark.parametrize("args", [{}, DSPARK7], ids=["nospec", "dspark7"])
def test_the_state_pool_admits_what_sglangs_formula_admits(args: dict[str, Any]) -> None:
    m = _b300_dcp8(args)
    draft_tokens = m.draft_slots  # gamma + 1 = 8 with DSPARK block 7, 0 without
    assert draft_tokens == (8 if args else 0)
    assert m.state_requests == sglang_state_requests(m, BASE_RATIO + OVERLAP_EXTRA, draft_tokens)


def test_64_dspark_requests_cannot_fit_with_13_slots_each_and_fit_with_the_no_overlap_ratio() -> None:
    """Why the pin stays: with the overlap scheduler's 5 slots + 8 intermediate states a request, 64 requests'
    state and their KV exceed the cache under every pool split, so the model's 61 is what SGLang's source gives;
    a server that ran 64 had the no-overlap ratio (3 + 1: 4 + 8 = 12 a request, 66 requests here) or more
    cache than the model's draft-weight estimate leaves (RadixArk's draft size is not published)."""
    m = _b300_dcp8(DSPARK7)
    cache = m.kv_pool_bytes + m.state_pool_bytes
    kv_64 = 64 * REQUEST_TOKENS * (m.mla_kv_bytes_per_token + m.draft_kv_bytes_per_token)
    assert 64 * 13 * m.kda_state_bytes_per_slot + kv_64 > cache
    assert m.state_requests == 61
    assert 64 * 12 * m.kda_state_bytes_per_slot + kv_64 < cache
    assert sglang_state_requests(m, BASE_RATIO + NO_OVERLAP_EXTRA, m.draft_slots) >= 64
