"""A worker taken out of a running router (its in-flight requests drained, bounded) and put back (healthy there,
with its role in PD mode), through the router's own API (engines/router_api.py MEMBERSHIP). What rollout does
to each replica or prefill/decode instance."""
from __future__ import annotations

import time
import urllib.parse

from k3deploy.engines.router_api import MEMBERSHIP, running_requests
from k3deploy.errors import ExecError
from k3deploy.executors.http import NodeHttp
from k3deploy.launch.registration import POLL_S
from k3deploy.serving.router_workers import workers_of


def listed(http: NodeHttp, url: str) -> bool:
    """Does the router list `url` (in any state)? ExecError when it cannot be asked."""
    rows, why = workers_of(http)
    if why:
        raise ExecError(why)
    return any(w.url == url for w in rows)


def take_out(http: NodeHttp, kind: str, url: str, drain_s: float) -> None:
    """Ask the router to drop `url` and wait until it no longer lists it and the worker runs nothing."""
    m = MEMBERSHIP[kind]
    listed(http, url)  # the router answers /workers before anything is asked of it
    ids = [w for w in _raw_workers(http) if str(w.get("url", "")).rstrip("/") == url]
    path = m.remove_path.format(id=ids[0].get("id", "") if ids else "", url=urllib.parse.quote(url, safe=""))
    reply = http.request(m.remove_method, path)
    if not reply.ok:
        raise ExecError(f"{m.remove_method} {path}: HTTP {reply.status}: {reply.text[:200]}")
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        rows, why = workers_of(http)
        if not why and not any(w.url == url for w in rows):
            break
        time.sleep(POLL_S)
    else:
        raise ExecError(f"the router still lists {url} after {drain_s:.0f} s of draining")
    # vllm-router and sglang-router drop a worker at once: what they already sent there still runs on it.
    with NodeHttp(url) as worker:
        while time.monotonic() < deadline:
            try:
                page = worker.get("/metrics", 5.0)
            except ExecError:
                return  # nothing answers: nothing left to drain
            left = running_requests(page.text) if page.ok else None
            if not left:
                return
            time.sleep(POLL_S)
    raise ExecError(f"{url} still runs requests after {drain_s:.0f} s of draining")


def _raw_workers(http: NodeHttp) -> list[dict[str, object]]:
    reply = http.get("/workers", 5.0)
    doc = reply.json() if reply.ok else {}
    return [w for w in doc.get("workers", []) if isinstance(w, dict)] if isinstance(doc, dict) else []


def put_back(http: NodeHttp, kind: str, url: str, timeout_s: float, role: str = "",
             bootstrap_port: int | None = None) -> None:
    """Register `url` (with its PD role and a prefill's bootstrap port) and wait until the router lists it
    healthy, as that role."""
    m = MEMBERSHIP[kind]
    path = m.add_path.format(url=urllib.parse.quote(url, safe=""))
    reply = http.request(m.add_method, path, m.add_json(url, role, bootstrap_port))
    if not reply.ok:
        raise ExecError(f"{m.add_method} {path}: HTTP {reply.status}: {reply.text[:200]}")
    deadline = time.monotonic() + timeout_s
    seen = "not listed"
    while time.monotonic() < deadline:
        rows, _ = workers_of(http)
        for w in rows:
            if w.url == url:
                seen = f"listed as {w.worker_type or 'a worker'}, " + ("healthy" if w.healthy else "not healthy")
                if w.healthy and (not role or w.worker_type == role):
                    return
        time.sleep(POLL_S)
    raise ExecError(f"{url} not healthy in the router" + (f" as a {role} worker" if role else "")
                    + f" after {timeout_s:.0f} s ({seen})")
