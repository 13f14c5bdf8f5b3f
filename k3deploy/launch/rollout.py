"""`k3deploy rollout`: one replica at a time out of the router (its requests drained, bounded), stopped,
started again (from the topology file as it is now), a real completion through it, back into the router and
healthy there; never fewer than N-1 serving. Between the completion and the router, the caller's checks (the
`short` validate stage, straight to the new replica) run. The first failure stops the rollout, naming replica and stage."""
from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Sequence

from k3deploy.engines.router_api import MEMBERSHIP, running_requests
from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.http import NodeHttp
from k3deploy.launch.registration import POLL_S, workers_of
from k3deploy.launch.service import ServicePlan, start_replica, stop_deployment
from k3deploy.launch.service_state import Service, ServiceStore
from k3deploy.launch.state import StateStore

DRAIN_TIMEOUT_S = 120.0
Say = Callable[[str], None]
# (stage name, check of replica index I: None when it passed, else why not), run before it is put back.
ReplicaCheck = tuple[str, Callable[[int], "str | None"]]


class RolloutFailed(LaunchError):
    """One replica failed a stage: the rollout stopped there (the others keep serving)."""

    def __init__(self, replica: str, stage: str, cause: str) -> None:
        super().__init__(f"rollout stopped at {replica}, stage {stage}: {cause}",
                         hint=f"the other replicas still serve; see k3deploy status {replica} and k3deploy logs "
                         f"{replica}")
        self.replica, self.stage = replica, stage


def _take_out(http: NodeHttp, kind: str, url: str, drain_s: float) -> None:
    """Ask the router to drop `url` and wait until it no longer lists it as taking requests."""
    m = MEMBERSHIP[kind]
    rows, why = workers_of(http)
    if why:
        raise ExecError(why)
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
    # vllm-router drops a worker at once: what it already sent there is still running on the replica.
    with NodeHttp(url) as replica:
        while time.monotonic() < deadline:
            try:
                page = replica.get("/metrics", 5.0)
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


def _put_back(http: NodeHttp, kind: str, url: str, timeout_s: float) -> None:
    """Register `url` and wait until the router lists it healthy."""
    m = MEMBERSHIP[kind]
    path = m.add_path.format(url=urllib.parse.quote(url, safe=""))
    reply = http.request(m.add_method, path, {"url": url} if m.add_body else None)
    if not reply.ok:
        raise ExecError(f"{m.add_method} {path}: HTTP {reply.status}: {reply.text[:200]}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows, _ = workers_of(http)
        if any(w.url == url and w.healthy for w in rows):
            return
        time.sleep(POLL_S)
    raise ExecError(f"{url} not healthy in the router after {timeout_s:.0f} s")


def _healthy_others(http: NodeHttp, svc: Service, url: str) -> int:
    rows, _ = workers_of(http)
    others = {r.url.rstrip("/") for r in svc.replicas} - {url}
    return sum(1 for w in rows if w.url in others and w.healthy)


def _noting(index: int, cause: str) -> Callable[[Service], Service]:
    return lambda s: s.with_replica(index, cause=cause)


def rollout(sp: ServicePlan, store: StateStore, *, factory: ExecutorFactory = open_executor,
            say: Say = lambda _: None, drain_s: float = DRAIN_TIMEOUT_S, skip_preflight: bool = True,
            checks: Sequence[ReplicaCheck] = ()) -> Service:
    """Restart every replica in turn behind the running router; RolloutFailed at the first failed stage (a
    failed check keeps the new replica out of the router)."""
    services = ServiceStore(store)
    svc = services.load(sp.name)
    if svc is None or svc.status not in ("ready", "degraded"):
        raise LaunchError(f"{sp.name} is not a running service ({svc.status if svc else 'no record'})",
                          hint=f"k3deploy launch {sp.plan.file}")
    kind, ready_s = svc.router_kind, sp.plan.topology.launch.ready_timeout_s
    with NodeHttp(svc.router_url) as http:
        for rep in svc.replicas:
            url = rep.url.rstrip("/")
            stage = "check"
            try:
                if len(svc.replicas) > 1 and _healthy_others(http, svc, url) < len(svc.replicas) - 1:
                    raise ExecError("another replica is not healthy in the router: taking this one out would "
                                    "leave fewer than N-1 serving")
                stage = "drain"
                say(f"{rep.name}: out of the router, draining")
                _take_out(http, kind, url, drain_s)
                stage = "stop"
                say(f"{rep.name}: stopping")
                stop_deployment(store, rep.name, factory)
                stage = "start"
                say(f"{rep.name}: starting")
                start_replica(sp, rep.index, store, factory=factory, skip_preflight=skip_preflight, tries=1)
                for stage, check in checks:
                    say(f"{rep.name}: validate stage {stage}")
                    why = check(rep.index)
                    if why is not None:
                        raise ExecError(why)
                stage = "register"
                say(f"{rep.name}: back into the router")
                _put_back(http, kind, url, ready_s)
            except (ExecError, LaunchError) as exc:
                services.update(sp.name, _noting(rep.index, f"rollout {stage}: {exc}"))
                raise RolloutFailed(rep.name, stage, str(exc)) from None
            say(f"{rep.name}: serving again")
    return services.update(sp.name, lambda s: s.model_copy(update={"status": "ready"}))
