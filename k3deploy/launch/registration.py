"""A router's workers registered and serving: every ready replica healthy in the router's `/workers`, then real
completions through the router until each replica has answered one (the router names who served, or else
each replica's own finished-requests counter grew)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from k3deploy.engines.router_api import SERVED_BY_HEADER, WORKERS_PATH
from k3deploy.errors import LaunchError
from k3deploy.executors.http import NodeHttp
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.serving.router_workers import finished_counts, workers_of

POLL_S = 0.5
# Cache-aware routing keeps a shared prefix on one replica: prompts that differ from their first character
# spread over the replicas; this many per replica at most.
PROMPTS_PER_REPLICA = 8
# An engine counts a request finished a moment after its answer went out: how long to wait for the count.
COUNT_LAG_S = 5.0


def _model(http: NodeHttp) -> str | None:
    reply = http.get("/v1/models", 10.0)
    listed = reply.json().get("data") if reply.ok else None
    return listed[0].get("id") if listed else None


def wait_registered(router: NodeJob, urls: Sequence[str], timeout_s: float, kind: str = "smg",
                    rounds: int | None = None) -> set[str]:
    """Until every URL is healthy in the router (LaunchError naming the others at the deadline); then the
    URLs seen serving a completion through the router, by its served-by header or else by their own finished
    counts (`rounds` completions; default: until each has served, at most PROMPTS_PER_REPLICA each)."""
    want = {u.rstrip("/") for u in urls}
    deadline = time.monotonic() + timeout_s
    with NodeHttp(router.ready.url or "") as http:
        missing, why = set(want), "not asked yet"
        for _ in range(10**6):
            rows, why = workers_of(http)
            healthy = {w.url for w in rows if w.healthy is not False}
            missing = want - healthy
            if not missing:
                break
            if time.monotonic() > deadline:
                raise LaunchError(f"router {router.ready.url}: {', '.join(sorted(missing))} not healthy in "
                                  f"{WORKERS_PATH} after {timeout_s:.0f} s" + (f" ({why})" if why else ""))
            time.sleep(POLL_S)
        header = SERVED_BY_HEADER.get(kind)
        before = None if header else finished_counts(want)
        if header is None and before is None and rounds is None:
            return set()  # neither the router nor the replicas say who served: no claim
        model = _model(http)
        served: set[str] = set()
        for n in range(rounds if rounds is not None else PROMPTS_PER_REPLICA * len(want)):
            reply = http.post("/v1/completions", {"model": model, "prompt": f"{uuid.uuid4().hex} {n}", "max_tokens": 1,
                                                  "temperature": 0}, 60.0)
            if not reply.ok:
                raise LaunchError(f"router {router.ready.url}: /v1/completions: HTTP {reply.status}: "
                                  f"{reply.text[:300]}")
            if header is not None:
                served.add(reply.headers.get(header, "").rstrip("/"))
            elif before is not None and (n + 1) % len(want) == 0:
                served = _grown(before, finished_counts(want))
            if want <= served:
                break
        lag = time.monotonic() + COUNT_LAG_S
        while before is not None and not want <= served and time.monotonic() < lag:
            time.sleep(POLL_S)
            served = _grown(before, finished_counts(want))
        return served & want


def _grown(before: dict[str, float] | None, after: dict[str, float] | None) -> set[str]:
    if before is None or after is None:
        return set()
    return {u for u, n in after.items() if n > before.get(u, n)}
