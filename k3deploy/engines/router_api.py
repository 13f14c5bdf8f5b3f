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
    worker_type: str = ""  # regular | prefill | decode (smg, sglang-router, vllm-router), or ""


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
                                status=str(w.get("status", "")), load=load if isinstance(load, int) else None,
                                worker_type=str(w.get("worker_type", ""))))
    return out


@dataclass(frozen=True)
class Membership:
    """How a router takes a worker out (draining its in-flight requests) and puts one in."""

    remove_method: str
    remove_path: str  # {id} the worker's id in /workers, {url} its URL (query-quoted)
    add_method: str
    add_path: str
    add_body: bool  # the URL goes in a JSON body {"url": ...} rather than the query
    pd_refused: str = ""  # why the router cannot put a prefill or decode worker back at runtime ("": it can)

    def add_json(self, url: str, role: str = "", bootstrap_port: int | None = None) -> dict[str, Any] | None:
        """The body that registers `url` (None: the URL goes in the query). In PD mode smg takes a worker
        posted without `worker_type` as `regular`, lists it healthy and never routes to it (seen with smg 1.13.0
        and sglang-router 0.3.2): a PD instance goes back with its role, a prefill with its bootstrap port."""
        if not self.add_body:
            return None
        body: dict[str, Any] = {"url": url}
        if role:
            body["worker_type"] = role
        if role == "prefill" and bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        return body


# smg 1.13.0 (seen here): DELETE /workers/{id} answers 202 and lists the worker `draining` until its requests
# end, then drops it; POST /workers {"url"} answers 202 and the worker is `ready` once it passes its checks.
# vllm-router 0.1.17 keeps the gateway's older routes (/add_worker, /remove_worker with ?url=; in its binary).
# In PD mode (seen here, prefill + 2 decodes of the stand-in): smg 1.13.0 and sglang-router 0.3.2 take
# POST /workers {"url", "worker_type": "prefill"|"decode", "bootstrap_port"} (202; listed with that type) and
# DELETE /workers/{id} (smg lists it `draining` ~5 s, sglang-router drops it at once). vllm-router 0.1.17
# removes a PD worker (/remove_worker: 200) but answers /add_worker (with or without worker_type) and POST
# /workers with HTTP 400 "PD router requires specific add_prefill_server or add_decode_server methods", and has
# no HTTP route to either method (its routes: /add_worker, /remove_worker, /list_workers, /workers,
# /workers/{url}): an instance taken out could never be put back.
VLLM_ROUTER_PD = ("vllm-router 0.1.17 cannot put a prefill or decode worker back at runtime: in PD mode it answers "
                  "/add_worker and POST /workers with HTTP 400 'PD router requires specific add_prefill_server or "
                  "add_decode_server methods', and no HTTP route reaches those (seen running it here; "
                  "k3deploy/engines/router_api.py)")
MEMBERSHIP = {
    "smg": Membership("DELETE", "/workers/{id}", "POST", "/workers", True),
    "sglang-router": Membership("DELETE", "/workers/{id}", "POST", "/workers", True),
    "vllm-router": Membership("POST", "/remove_worker?url={url}", "POST", "/add_worker?url={url}", False,
                              pd_refused=VLLM_ROUTER_PD),
}

# What a replica is still serving, from its own /metrics (real names: SGLang's and vLLM's gauges); the drain
# waits on these after a router that drops a worker at once (vllm-router) took it out. Waiting requests count:
# one the router sent just before dropping the worker may still be queued, not yet running.
RUNNING_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "vllm:num_requests_running",
                  "vllm:num_requests_waiting")
# Requests a replica has finished, from its own /metrics (vLLM 0.32.0's counter, read from the real engine):
# who served through a router that names no worker (vllm-router) is whose count grew.
FINISHED_COUNTERS = ("vllm:request_success_total",)
# Prompt tokens an engine has processed (SGLang's and vLLM's counters; docs/references/production_metrics.md,
# vLLM 0.32.0's /metrics): a PD request grows them on its prefill and its decode alike, so a new instance that
# took part in a request through the router is one whose count grew.
PROMPT_COUNTERS = ("sglang:prompt_tokens_total", "vllm:prompt_tokens_total")


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


def prompt_tokens(metrics_text: str) -> float | None:
    """The prompt tokens the engine has processed, from a Prometheus text page (None when it has no counter)."""
    return _sum(metrics_text, PROMPT_COUNTERS)
