"""What a memory budget holds (Capacity) and the feasibility verdicts on it, each saying by how much. Pure."""
from __future__ import annotations

from typing import Any, NamedTuple

from k3deploy.diagnostics import Issue, fmt_gib
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.planning.memory import MemoryBudget


class Capacity(NamedTuple):
    """What the caches hold."""

    kv_tokens: int
    max_running_requests: int
    max_context_tokens: int

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value (the `plan --json` capacity object)."""
        return self._asdict()



def memory_issues(m: MemoryBudget, family: EngineFamily, context_length: int,
                  max_running_requests: int | None) -> tuple[list[Issue], Capacity]:
    """Feasibility verdicts on a budget, each saying by how much; `max_running_requests` None: the engine admits
    what its state pool holds."""
    out: list[Issue] = []
    need = m.weights_bytes + m.reserve_bytes
    ctx = context_length
    if need > m.usable_bytes:
        out.append(Issue(code="MEM_WEIGHTS", severity="error", path="parallel",
                         message=f"weights {fmt_gib(m.weights_bytes)} + reserve {fmt_gib(m.reserve_bytes)} = "
                         f"{fmt_gib(need)} exceed usable {fmt_gib(m.usable_bytes)} per GPU by "
                         f"{fmt_gib(need - m.usable_bytes)}",
                         hint="shard wider (more GPUs, higher tp/ep) or use a larger accelerator; "
                         "`k3deploy plan --search` lists shapes that fit"))
    elif m.kv_pool_bytes <= 0 or (m.state_pool_bytes <= 0 and m.kda_state_bytes_per_slot > 0):
        out.append(Issue(code="MEM_NO_CACHE", severity="error", path="serving.mem_fraction",
                         message=f"mem_fraction {m.mem_fraction} x usable {fmt_gib(m.usable_bytes)} leaves no cache "
                         f"memory after weights {fmt_gib(m.weights_bytes)}"
                         + (f" and reserve {fmt_gib(m.reserve_bytes)}" if family == "vllm" else ""),
                         hint="raise serving.mem_fraction or shard wider"))
    else:
        if m.kv_tokens < ctx:
            short = (ctx - m.kv_tokens) * m.mla_kv_bytes_per_token
            out.append(Issue(code="MEM_KV_CONTEXT", severity="error", path="serving.context_length",
                             message=f"the KV pool holds {m.kv_tokens} tokens; one request at context_length "
                             f"{ctx} needs {ctx} (short by {ctx - m.kv_tokens} tokens = {fmt_gib(short)})"))
        if m.state_requests < 1:
            out.append(Issue(code="MEM_STATE", severity="error", path="serving",
                             message=f"the KDA state pool ({fmt_gib(m.state_pool_bytes)}) cannot hold one request's "
                             f"{m.slots_per_request} slots x {m.kda_state_bytes_per_slot} B"))
    if family == "sglang" and m.headroom_bytes < 0 and need <= m.usable_bytes:
        out.append(Issue(code="MEM_RUNTIME", severity="warning", path="serving.mem_fraction",
                         message=f"mem_fraction {m.mem_fraction} leaves "
                         f"{fmt_gib(m.headroom_bytes + m.reserve_bytes)} free after the pools, below the "
                         f"{fmt_gib(m.reserve_bytes)} runtime reserve: CUDA-graph capture may run out of memory",
                         hint=f"lower mem_fraction to "
                         f"{1 - m.reserve_bytes / (m.usable_bytes - m.engine_preload_bytes):.3f} or less"))
    asked = m.state_requests if max_running_requests is None else max_running_requests
    running = min(asked, m.state_requests)
    if m.state_requests and m.state_requests < asked:
        out.append(Issue(code="CONCURRENCY_CAPPED", severity="warning", path="serving.max_running_requests",
                         message=f"the KDA state pool holds {m.state_requests} requests, fewer than "
                         f"max_running_requests {asked}"))
    max_running_requests = asked
    per_request = m.kv_tokens // max(max_running_requests, 1)
    cap = Capacity(kv_tokens=m.kv_tokens, max_running_requests=running, max_context_tokens=min(per_request, ctx))
    if m.kv_tokens >= ctx and per_request < ctx:
        out.append(Issue(code="CONTEXT_AT_CONCURRENCY", severity="warning", path="serving.context_length",
                         message=f"the KV pool holds {m.kv_tokens:,} tokens: at {max_running_requests} concurrent "
                         f"requests each can get {per_request:,} tokens, not context_length {ctx:,}",
                         hint=f"full-length requests fit {m.kv_tokens // ctx} at a time: lower "
                         f"max_running_requests to {m.kv_tokens // ctx}, or context_length to {per_request:,}, "
                         "or shard wider"))
    return out, cap
