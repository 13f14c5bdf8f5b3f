"""An engine's `/metrics` page read as the figures `top` shows: one scrape is a Sample of gauges and counters,
two scrapes of the same engine a window's Figures (rates and means over the counters' growth)."""
from __future__ import annotations

from typing import NamedTuple

# role -> the metric families that carry it, under the real engines' own names (vLLM 0.32.0's /metrics, read
# from the real engine; SGLang's docs/references/production_metrics.md). Counters as the page spells them.
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_use": ("vllm:kv_cache_usage_perc", "sglang:token_usage"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    # vLLM counts prefix-cache hits and queries in tokens; SGLang counts cached prompt tokens (its queries are
    # its prompt tokens).
    "cache_hits": ("vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"),
    "cache_queries": ("vllm:prefix_cache_queries_total",),
    "requests": ("vllm:request_success_total", "sglang:num_requests_total"),
    "ttft_sum": ("vllm:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_sum"),
    "ttft_count": ("vllm:time_to_first_token_seconds_count", "sglang:time_to_first_token_seconds_count"),
    # TPOT as the engines measure it between tokens of a stream (vLLM's and SGLang's inter-token histogram).
    "itl_sum": ("vllm:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_sum"),
    "itl_count": ("vllm:inter_token_latency_seconds_count", "sglang:inter_token_latency_seconds_count"),
}
_ROLE = {name: role for table in (GAUGES, COUNTERS) for role, names in table.items() for name in names}


class Sample(NamedTuple):
    """One scrape: each role's value summed over its series (an engine's data-parallel ranks), at `at_s`."""

    at_s: float
    values: dict[str, float]


class Figures(NamedTuple):
    """One engine over a window: gauges as last scraped, rates and means from its counters' growth (None: the
    page has no such metric, or nothing finished in the window to average)."""

    window_s: float
    running: float | None
    waiting: float | None
    kv_use: float | None  # 0..1
    prefix_hit_rate: float | None  # 0..1, of the prompt tokens looked up in the window
    generated_tok_s: float | None
    requests_done: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    input_tokens: float | None  # per finished request in the window
    output_tokens: float | None


def parse_sample(text: str, at_s: float) -> Sample:
    """The roles `top` reads from a Prometheus text page (other families, comments and bad lines skipped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        role = _ROLE.get(name)
        if role is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        values[role] = values.get(role, 0.0) + value
    return Sample(at_s, values)


def figures(first: Sample, last: Sample) -> Figures:
    """The window from `first` to `last` of one engine (a counter that went down means a restart: its growth
    is counted from zero)."""
    dt = max(last.at_s - first.at_s, 1e-9)

    def grew(role: str) -> float | None:
        if role not in last.values:
            return None
        now, then = last.values[role], first.values.get(role, 0.0)
        return now - then if now >= then else now

    def mean(total: str, count: str, scale: float) -> float | None:
        s, n = grew(total), grew(count)
        return s / n * scale if s is not None and n else None

    hits, queries, prompt = grew("cache_hits"), grew("cache_queries"), grew("prompt_tokens")
    looked_up = queries if queries is not None else prompt
    done, gen = grew("requests"), grew("generation_tokens")
    return Figures(
        window_s=dt, running=last.values.get("running"), waiting=last.values.get("waiting"),
        kv_use=last.values.get("kv_use"),
        prefix_hit_rate=hits / looked_up if hits is not None and looked_up else None,
        generated_tok_s=gen / dt if gen is not None else None, requests_done=done,
        ttft_ms=mean("ttft_sum", "ttft_count", 1000.0), tpot_ms=mean("itl_sum", "itl_count", 1000.0),
        input_tokens=prompt / done if prompt is not None and done else None,
        output_tokens=gen / done if gen is not None and done else None)
