"""The fixes for a KDA state pool that admits fewer requests than asked (seed 002, section 50.2: "Server starts but
accepts few requests"), each with what it would admit, computed by sizing the pools again. Pure."""
from __future__ import annotations

import math

from k3deploy.catalog.specs import ModelSpec
from k3deploy.engines.shape import Shape
from k3deploy.planning.memory import MemoryBudget, MemoryInputs, memory_budget


def fitting_pool_ratio(m: MemoryBudget, requests: int) -> float | None:
    """The smallest SGLang --mamba-full-memory-ratio (3 decimals, rounded up) whose state pool holds `requests`;
    None when the whole cache cannot."""
    per_request = m.slots_per_request * (m.kda_state_bytes_per_slot + m.replay_ring_bytes_per_slot)
    cache = m.kv_pool_bytes + m.state_pool_bytes
    need = requests * per_request
    if need >= cache:
        return None
    return math.ceil(need / (cache - need) * 1000 + 1e-9) / 1000


def concurrency_fixes(model: ModelSpec, usable_bytes: int, shape: Shape, inp: MemoryInputs, m: MemoryBudget,
                      asked: int) -> str:
    """The hint of CONCURRENCY_CAPPED: every fix the seed lists that applies here, with its numbers."""
    def admits(changed: MemoryInputs) -> MemoryBudget:
        return memory_budget(model, usable_bytes, shape, changed)

    fixes: list[str] = []
    if inp.family == "sglang":
        ratio = fitting_pool_ratio(m, asked)
        if ratio is not None:
            r = admits(inp._replace(pool_ratio=ratio, pool_calculator=False))
            fixes.append(f"set serving.mamba_full_memory_ratio: {ratio} (was {m.pool_ratio:.3g}): the state pool "
                         f"holds {r.state_requests} requests and the KV pool {r.kv_tokens:,} tokens "
                         f"(from {m.kv_tokens:,})")
    if inp.ssm_dtype == "fp32":
        fixes.append(f"state_dtype: bf16 (validate accuracy first): {admits(inp._replace(ssm_dtype='bf16')).state_requests} requests")
    if inp.family == "sglang" and inp.prefix_cache and inp.prefix_cache_strategy != "no_buffer":
        fixes.append(f"prefix_cache_strategy: no_buffer (fewer state slots a request): "
                     f"{admits(inp._replace(prefix_cache_strategy='no_buffer')).state_requests} requests")
    if inp.drafts:
        fixes.append(f"drop the speculative flags (no draft state slots): {admits(inp._replace(drafts=0)).state_requests} requests")
    fixes.append(f"raise attention TP (a slot is {m.kda_state_bytes_per_slot:,} B at attn_tp {shape.attn_tp}; "
                 "it halves with each doubling)")
    fixes.append(f"or cap serving.max_running_requests at {m.state_requests}")
    return "; ".join(fixes)
