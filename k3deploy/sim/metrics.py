"""/metrics with prometheus_client, under the mimicked engine's own metric names and labels.

Counters are declared without `_total` (prometheus_client adds it to the sample, as the engines' do)
and without `_created` series;
gauges are read from the live serving state at scrape time; the TTFT, inter-token and end-to-end
histograms use the engines' buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from k3deploy.sim.engine_args import Mimic

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _edges(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split())


# `_created` samples read back as families of their own (gauges) in the text format; the engines'
# scrapers never use them.
disable_created_metrics()
# The engines' bucket edges, in seconds.
TTFT_BUCKETS = _edges(
    "0.001 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.25 0.5 0.75 1 2.5 5 7.5 10 20 40 80 160 640 2560"
)
ITL_BUCKETS = _edges("0.01 0.025 0.05 0.075 0.1 0.15 0.2 0.3 0.4 0.5 0.75 1 2.5 5 7.5 10 20 40 80")
E2E_BUCKETS = _edges("0.3 0.5 0.8 1 1.5 2 2.5 5 10 15 20 30 40 50 60 120 240 480 960 1920 7680")
# role -> metric name, under each engine's own spelling.
_NAMES: dict[str, dict[str, str]] = {
    "sglang": {
        "running": "sglang:num_running_reqs",
        "queued": "sglang:num_queue_reqs",
        "kv_usage": "sglang:token_usage",
        "prompt": "sglang:prompt_tokens",
        "generation": "sglang:generation_tokens",
        "hits": "sglang:cached_tokens",
        "requests": "sglang:num_requests",
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "e2e": "sglang:e2e_request_latency_seconds",
    },
    "vllm": {
        "running": "vllm:num_requests_running",
        "queued": "vllm:num_requests_waiting",
        "kv_usage": "vllm:kv_cache_usage_perc",
        "prompt": "vllm:prompt_tokens",
        "generation": "vllm:generation_tokens",
        "hits": "vllm:prefix_cache_hits",
        "queries": "vllm:prefix_cache_queries",
        "requests": "vllm:request_success",
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
    },
}


@dataclass
class ServingStats:
    """Live state the gauges read, kept by the chat service."""

    running: int = 0
    queued: int = 0
    kv_used_tokens: int = 0
    kv_total_tokens: int = 1
    state_slots_used: int = 0
    state_slots_total: int = 1
    prompt_tokens: int = 0
    cached_tokens: int = 0


class EngineMetrics:
    """One engine's registry: counters and histograms fed per request, gauges set at scrape time."""

    def __init__(self, mimic: Mimic, model_name: str, stats: ServingStats) -> None:
        self.mimic, self.stats = mimic, stats
        self.registry = CollectorRegistry()
        n = _NAMES[mimic]
        labels = (
            {"model_name": model_name} if mimic == "sglang" else {"engine": "0", "model_name": model_name}
        )
        keys = list(labels)

        def counter(role: str, text: str) -> Counter:
            return Counter(n[role], text, keys, registry=self.registry).labels(**labels)

        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, keys, registry=self.registry).labels(**labels)

        def histogram(role: str, text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(n[role], text, keys, buckets=buckets, registry=self.registry).labels(**labels)

        self.running = gauge(n["running"], "Number of requests in model execution batches.")
        self.queued = gauge(n["queued"], "Number of requests waiting to be processed.")
        self.kv_usage = gauge(n["kv_usage"], "KV-cache usage. 1 means 100 percent usage.")
        self.prompt = counter("prompt", "Number of prefill tokens processed.")
        self.generation = counter("generation", "Number of generation tokens processed.")
        self.hits = counter("hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.ttft = histogram("ttft", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("itl", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = histogram("e2e", "Histogram of end to end request latency in seconds.", E2E_BUCKETS)
        self.hit_rate: Gauge | None = None
        self.state_usage: Gauge | None = None
        if mimic == "sglang":
            self.requests = counter("requests", "Number of requests processed.")
            self.hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
            self.state_usage = gauge("sglang:mamba_usage", "The mamba state pool usage.")
        else:
            self.queries = counter("queries", "Prefix cache queries, in terms of number of queried tokens.")
            self._success = Counter(
                n["requests"],
                "Count of successfully processed requests.",
                [*keys, "finished_reason"],
                registry=self.registry,
            )
            self._labels = labels

    def finished(self, prompt: int, generated: int, cached: int, queried: int, reason: str) -> None:
        """Count one finished request."""
        self.prompt.inc(prompt)
        self.generation.inc(generated)
        self.hits.inc(cached)
        if self.mimic == "sglang":
            self.requests.inc()
        else:
            self.queries.inc(queried)
            self._success.labels(**self._labels, finished_reason=reason).inc()

    def render(self) -> bytes:
        """The exposition text, gauges refreshed from the live state."""
        s = self.stats
        self.running.set(s.running)
        self.queued.set(s.queued)
        self.kv_usage.set(min(s.kv_used_tokens / max(s.kv_total_tokens, 1), 1.0))
        if self.hit_rate is not None:
            self.hit_rate.set(s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0)
        if self.state_usage is not None:
            self.state_usage.set(min(s.state_slots_used / max(s.state_slots_total, 1), 1.0))
        return generate_latest(self.registry)
