"""What each real router answers about its workers (`GET /workers`) and how it names the worker that served a
request; taken from running smg 1.13.0 and sglang-router 0.3.2 (same gateway) and vllm-router 0.1.17 here.
Pure: JSON in, rows out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WORKERS_PATH = "/workers"
# smg answers every routed request with the URL of the worker that served it (seen on /v1/chat/completions
# and /v1/completions with smg 1.13.0); vllm-router 0.1.17 sends no such header.
SERVED_BY_HEADER = {"smg": "x-smg-routed-worker-id", "sglang-router": "x-smg-routed-worker-id"}


@dataclass(frozen=True)
class RouterWorker:
    """One worker as the router sees it."""

    url: str
    healthy: bool | None  # None: the router does not say
    status: str  # the router's own word for it ("ready", ...), or ""
    load: int | None


def _rows(doc: Any) -> list[dict[str, Any]]:
    # smg: {"workers": [{...}], "total": N, "stats": {...}}; vllm-router: {"urls": [...]} or a list.
    if isinstance(doc, dict):
        for key in ("workers", "urls"):
            if isinstance(doc.get(key), list):
                return [w if isinstance(w, dict) else {"url": str(w)} for w in doc[key]]
    if isinstance(doc, list):
        return [w if isinstance(w, dict) else {"url": str(w)} for w in doc]
    return []


def router_workers(doc: Any) -> list[RouterWorker]:
    """The router's `/workers` answer as rows (smg: url, is_healthy, status, load)."""
    out = []
    for w in _rows(doc):
        healthy = w.get("is_healthy", w.get("healthy"))
        load = w.get("load")
        out.append(RouterWorker(url=str(w.get("url", "")).rstrip("/"),
                                healthy=healthy if isinstance(healthy, bool) else None,
                                status=str(w.get("status", "")), load=load if isinstance(load, int) else None))
    return out


@dataclass(frozen=True)
class Membership:
    """How a router takes a worker out (draining its in-flight requests) and puts one in."""

    remove_method: str
    remove_path: str  # {id} the worker's id in /workers, {url} its URL (query-quoted)
    add_method: str
    add_path: str
    add_body: bool  # the URL goes in a JSON body {"url": ...} rather than the query


# smg 1.13.0 (seen here): DELETE /workers/{id} answers 202 and lists the worker `draining` until its requests
# end, then drops it; POST /workers {"url"} answers 202 and the worker is `ready` once it passes its checks.
# vllm-router 0.1.17 keeps the gateway's older routes (/add_worker, /remove_worker with ?url=; in its binary).
MEMBERSHIP = {
    "smg": Membership("DELETE", "/workers/{id}", "POST", "/workers", True),
    "sglang-router": Membership("DELETE", "/workers/{id}", "POST", "/workers", True),
    "vllm-router": Membership("POST", "/remove_worker?url={url}", "POST", "/add_worker?url={url}", False),
}

# What a replica is still serving, from its own /metrics (real names: SGLang's and vLLM's gauges); the drain
# waits on these after a router that drops a worker at once (vllm-router) took it out. Waiting requests count:
# one the router sent just before dropping the worker may still be queued, not yet running.
RUNNING_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "vllm:num_requests_running",
                  "vllm:num_requests_waiting")
# Requests a replica has finished, from its own /metrics (vLLM 0.32.0's counter, read from the real engine):
# who served through a router that names no worker (vllm-router) is whose count grew.
FINISHED_COUNTERS = ("vllm:request_success_total",)


def _sum(metrics_text: str, names: tuple[str, ...]) -> float | None:
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return total if seen else None


def running_requests(metrics_text: str) -> float | None:
    """The requests running or waiting, from a Prometheus text page (None when it has no such gauge)."""
    return _sum(metrics_text, RUNNING_GAUGES)


def finished_requests(metrics_text: str) -> float | None:
    """The requests the engine has finished, from a Prometheus text page (None when it does not count them)."""
    return _sum(metrics_text, FINISHED_COUNTERS)
