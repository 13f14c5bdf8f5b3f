"""What a router says of its workers (`/workers`), and what each replica says it has served (its `/metrics`)."""
from __future__ import annotations

from k3deploy.engines.router_api import WORKERS_PATH, RouterWorker, finished_requests, router_workers
from k3deploy.errors import ExecError
from k3deploy.executors.http import NodeHttp


def workers_of(http: NodeHttp, timeout_s: float = 5.0) -> tuple[list[RouterWorker], str]:
    """The router's workers, or ([], why not)."""
    try:
        reply = http.get(WORKERS_PATH, timeout_s)
    except ExecError as exc:
        return [], str(exc)
    if not reply.ok:
        return [], f"{WORKERS_PATH}: HTTP {reply.status}"
    try:
        return router_workers(reply.json()), ""
    except ValueError:
        return [], f"{WORKERS_PATH}: not JSON: {reply.text[:200]}"


def finished_counts(urls: set[str]) -> dict[str, float] | None:
    """Each replica's finished requests from its own /metrics; None when one cannot be read from here."""
    out = {}
    for url in urls:
        try:
            with NodeHttp(url) as http:
                page = http.get("/metrics", 5.0)
        except ExecError:
            return None
        count = finished_requests(page.text) if page.ok else None
        if count is None:
            return None
        out[url] = count
    return out
