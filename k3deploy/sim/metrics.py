"""Serving counters and their Prometheus text under the mimicked engine's metric names."""

from __future__ import annotations

from dataclasses import dataclass

from k3deploy.sim.engine_args import Mimic


@dataclass
class ServingStats:
    """Running totals since start; gauges are set by the chat service as it goes."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    cache_queries: int = 0
    running: int = 0
    queued: int = 0
    kv_used_tokens: int = 0
    kv_total_tokens: int = 1
    state_slots_used: int = 0
    state_slots_total: int = 1


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str, labels: str, value: float) -> str:
    # prometheus_client names a counter family without `_total` and its sample with it.
    sample = f"{name}_total" if kind == "counter" else name
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{sample}{{{labels}}} {float(value)!r}\n"


def render_metrics(mimic: Mimic, stats: ServingStats, model_name: str) -> str:
    """The /metrics body (Prometheus text format 0.0.4)."""
    s = stats
    kv_usage = min(s.kv_used_tokens / max(s.kv_total_tokens, 1), 1.0)
    if mimic == "sglang":
        labels = f'model_name="{_escape(model_name)}"'
        hit_rate = s.cached_tokens / s.cache_queries if s.cache_queries else 0.0
        families = [
            ("sglang:prompt_tokens", "counter", "Number of prefill tokens processed.", s.prompt_tokens),
            (
                "sglang:generation_tokens",
                "counter",
                "Number of generation tokens processed.",
                s.generation_tokens,
            ),
            ("sglang:cached_tokens", "counter", "Number of cached prompt tokens.", s.cached_tokens),
            ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", hit_rate),
            ("sglang:token_usage", "gauge", "The token usage.", kv_usage),
            (
                "sglang:mamba_usage",
                "gauge",
                "The mamba state pool usage.",
                min(s.state_slots_used / max(s.state_slots_total, 1), 1.0),
            ),
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", s.running),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", s.queued),
        ]
    else:
        labels = f'engine="0",model_name="{_escape(model_name)}"'
        families = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                s.running,
            ),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", s.queued),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv_usage),
            (
                "vllm:prefix_cache_queries",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                s.cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                s.cached_tokens,
            ),
            ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", s.prompt_tokens),
            (
                "vllm:generation_tokens",
                "counter",
                "Number of generation tokens processed.",
                s.generation_tokens,
            ),
        ]
    return "".join(_family(name, kind, text, labels, value) for name, kind, text, value in families)
