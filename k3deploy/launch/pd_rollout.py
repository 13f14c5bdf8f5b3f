"""`k3deploy rollout` of prefill/decode roles behind a router in PD mode: one instance at a time, prefills first,
then decodes. Each is taken out of the router and drained, a real completion through the router shows the rest
still serve, it is stopped, started from the topology as it is now, put back with its role (a prefill with its
bootstrap port), healthy there, seen taking part in requests through the router, and checked (`short`). Never
fewer than one healthy instance of each role: a role with a single instance, a router that cannot put a PD worker
back, or a topology whose instances differ from the running ones is refused before anything is touched.

Prefills go first: a prefill holds nothing past a request (its cache is short-lived), a decode holds the running
generations and the prefix cache conversations hit, so a broken new version (say, a transfer the old decodes
cannot read) shows on the cheap role before any decode's cache is given up."""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from k3deploy.engines.router_api import MEMBERSHIP, prompt_tokens
from k3deploy.errors import ExecError, InputError, LaunchError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.http import NodeHttp, completes
from k3deploy.launch.membership import listed, put_back, take_out
from k3deploy.launch.prepare import Unit
from k3deploy.launch.registration import POLL_S
from k3deploy.launch.rollout import (
    DRAIN_TIMEOUT_S,
    InstanceOps,
    ReplicaCheck,
    RolloutFailed,
    Say,
    Steps,
    deployment_ops,
    healthy_others,
    noting,
    restart,
    run_checks,
    running,
)
from k3deploy.records.service import ReplicaEntry, Service, ServiceStore
from k3deploy.records.store import StateStore

ROLE_ORDER = ("prefill", "decode")
# Completions through the router until a new instance is seen taking part (its own prompt-token count grew):
# under the random policy two instances of a role leave one unseen after 16 with odds of 1 in 65536; cache-aware
# sends a prompt that matches no tree to the smallest, the new instance's empty one.
SERVE_ROUNDS = 16
COUNT_LAG_S = 5.0  # an engine counts a request a moment after its answer went out


def refuse(unit: Unit, svc: Service | None) -> None:
    """InputError (exit 2) when a rolling restart of these roles cannot keep serving, before anything is touched."""
    t, file, name = unit.plan.topology, unit.plan.file, unit.name
    assert t.router is not None
    why = MEMBERSHIP[t.router.kind].pd_refused
    if why:
        raise InputError(f"{file}: rollout of prefill/decode roles through {t.router.kind} is refused: {why}",
                         hint=f"restart every instance at once: k3deploy stop {name}, then k3deploy launch {file}; "
                         "or front the roles with smg (router.kind: smg), which takes PD workers at runtime")
    for role in ROLE_ORDER:
        count = unit.roles.count(role)
        if count < 2:
            only = unit.instances[unit.roles.index(role)].name
            raise InputError(f"{file}: roles.{role} has a single instance ({only}): taking it out of the router "
                             f"would stop serving (every request needs a {role} instance)",
                             hint=f"add an instance of that role (roles.{role}.instances: {count + 1}, with its "
                             f"nodes), k3deploy stop {name} and k3deploy launch {file}; then rollout keeps one "
                             "serving while the other restarts")
    if svc is None:
        return
    now = tuple(zip((part.name for part in unit.instances), unit.roles, unit.plan.router.settings.worker_urls
                    if unit.plan.router else ()))
    was = tuple((r.name, r.role, r.url) for r in svc.replicas)
    if now != was:
        gone = sorted({f"{role} {n} at {u}" for n, role, u in was} - {f"{role} {n} at {u}" for n, role, u in now})
        new = sorted({f"{role} {n} at {u}" for n, role, u in now} - {f"{role} {n} at {u}" for n, role, u in was})
        raise InputError(f"{file}: the roles' instances differ from the running service {name}'s (running: "
                         f"{', '.join(gone) or 'the same, in another order'}; in the file: {', '.join(new) or '-'}): "
                         "rollout restarts each instance in its place, it does not add, remove or move one",
                         hint=f"k3deploy stop {name}, then k3deploy launch {file}")


def order(svc: Service) -> list[ReplicaEntry]:
    """The instances in rollout order: every prefill, then every decode, each role by index."""
    return sorted(svc.replicas, key=lambda r: (ROLE_ORDER.index(r.role), r.index))


def rollout_roles(unit: Unit, store: StateStore, *, factory: ExecutorFactory = open_executor,
                  say: Say = lambda _: None, drain_s: float = DRAIN_TIMEOUT_S, checks: Sequence[ReplicaCheck] = (),
                  ops: InstanceOps | None = None) -> Service:
    """Restart every instance in turn behind the running router; InputError before anything when it cannot keep
    each role serving, RolloutFailed at the first failed stage (a new instance that failed is left out)."""
    services = ServiceStore(store)
    refuse(unit, services.load(unit.name))
    svc = running(services, unit)
    assert unit.plan.router is not None
    ops = ops or deployment_ops(unit, store, factory)
    kind, ready_s = svc.router_kind, unit.plan.topology.launch.ready_timeout_s
    boot = dict(unit.plan.router.settings.prefill)
    with NodeHttp(svc.router_url) as http:
        for rep in order(svc):
            url, role, steps = rep.url.rstrip("/"), rep.role, Steps(f"{rep.role} {rep.name}", say)
            try:
                if listed(http, url):
                    _other_serves(http, svc, rep)
                    steps("drain", "out of the router, draining")
                    take_out(http, kind, url, drain_s)
                    steps("others-serve", "out; a completion through the router must be answered without it")
                    _others_serve(http, kind, rep, ready_s, boot.get(rep.url))
                else:
                    say(f"{steps.label}: not in the router (nothing to drain)")
                restart(ops, rep.index, steps)
                steps("register", f"back into the router as {role}")
                put_back(http, kind, url, ready_s, role, boot.get(rep.url))
                steps.stage = "serve"
                say(f"{steps.label}: " + _takes_part(http, url))
                run_checks(checks, rep.index, steps, " through the router")
            except (ExecError, LaunchError) as exc:
                cause = str(exc)
                if steps.stage not in ("check", "drain", "others-serve", "stop", "start", "register"):
                    cause += _left_out(http, kind, url, drain_s)
                services.update(unit.name, _failed(rep.index, f"rollout {steps.stage}: {cause}"))
                raise RolloutFailed(rep.name, steps.stage, cause, role) from None
            services.update(unit.name, noting(rep.index, ""))
            say(f"{steps.label}: serving again")
    return services.update(unit.name, lambda s: s.model_copy(update={"status": "ready"}))


def _failed(index: int, cause: str) -> Callable[[Service], Service]:
    """The record change for an instance the rollout stopped at: named, the service degraded (the rest serve)."""
    return lambda s: noting(index, cause)(s).model_copy(update={"status": "degraded"})


def _other_serves(http: NodeHttp, svc: Service, rep: ReplicaEntry) -> None:
    """ExecError unless another instance of the role is healthy in the router (it keeps the role serving)."""
    if not healthy_others(http, svc, rep.url.rstrip("/"), rep.role):
        raise ExecError(f"no other {rep.role} instance is healthy in the router: taking {rep.name} out would "
                        f"leave no {rep.role} serving")


def _others_serve(http: NodeHttp, kind: str, rep: ReplicaEntry, ready_s: float, bootstrap: int | None) -> None:
    """A real completion through the router with `rep` out; when none is answered it goes back (it still runs)."""
    ok, _, why = completes(http)
    if ok:
        return
    try:
        put_back(http, kind, rep.url.rstrip("/"), ready_s, rep.role, bootstrap)
        back = f"{rep.name} is back in the router, unchanged"
    except ExecError as exc:
        back = f"putting {rep.name} back failed too: {exc}"
    raise ExecError(f"with {rep.name} out, a completion through the router failed ({why}); {back}")


def _counted(url: str) -> float | None:
    try:
        with NodeHttp(url) as worker:
            page = worker.get("/metrics", 5.0)
    except ExecError:
        return None
    return prompt_tokens(page.text) if page.ok else None


def _takes_part(http: NodeHttp, url: str) -> str:
    """Completions through the router until the instance's own prompt-token count grows; what was seen, or
    ExecError when none reached it."""
    before = _counted(url)
    models = http.get("/v1/models", 10.0)
    names = models.json().get("data") if models.ok else None
    model = names[0].get("id") if names else None
    for n in range(SERVE_ROUNDS):
        reply = http.post("/v1/completions", {"model": model, "prompt": f"{uuid.uuid4().hex} {n}", "max_tokens": 2,
                                              "temperature": 0}, 60.0)
        if not reply.ok:
            raise ExecError(f"a completion through the router: HTTP {reply.status}: {reply.text[:300]}")
        if before is None:
            return "the router answers (its own /metrics cannot be read from here: whether it took part is unknown)"
        deadline = time.monotonic() + (COUNT_LAG_S if n == SERVE_ROUNDS - 1 else 0)
        while True:
            after = _counted(url)
            if after is not None and after > before:
                return f"takes part in requests through the router (its prompt-token count grew, {n + 1} sent)"
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
    raise ExecError(f"{SERVE_ROUNDS} completions through the router answered, none reached it (its own "
                    "prompt-token count did not grow)")


def _left_out(http: NodeHttp, kind: str, url: str, drain_s: float) -> str:
    """Take a new instance that failed its checks out of the router again (it runs, serving no client)."""
    try:
        take_out(http, kind, url, drain_s)
    except ExecError as exc:
        return f"; taking it out of the router again failed: {exc}"
    return "; it runs, out of the router"
