"""The replica pool (replicas x GPUs, aggregate cache and concurrency) and the router's settings sized from the
plan: the health-check timeout above the longest prefill a replica allows, the start-up timeout above the
load time the deployment allows. Pure."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from k3deploy.diagnostics import Issue
from k3deploy.engines.router import RouterSettings
from k3deploy.topology.schema import Topology

# Never under this: a health check also waits behind one decode step and the HTTP round trip.
HEALTH_TIMEOUT_FLOOR_S = 30
# When the performance model cannot time the prefill nothing bounds it: a generous fixed timeout.
HEALTH_TIMEOUT_UNKNOWN_S = 300


class Pool(NamedTuple):
    """What all replicas hold together."""

    replicas: int
    gpus: int
    kv_tokens: int
    max_running_requests: int

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value (the `plan --json` pool object)."""
        return self._asdict()


class RouterPlan(NamedTuple):
    """The router's settings and where they came from."""

    settings: RouterSettings
    runs_on: str
    longest_prefill_s: float | None
    prefill_unknown: str | None = None  # why the performance model could not time the prefill

    def model_dump(self) -> dict[str, Any]:
        """The `plan --json` router object."""
        s = self.settings
        return {"kind": s.kind, "runs_on": self.runs_on, "url": s.url, "policy": s.policy,
                "worker_urls": list(s.worker_urls), "prefill": [list(p) for p in s.prefill] or None,
                "decode": list(s.decode) or None, "longest_prefill_s": self.longest_prefill_s,
                "health_check_timeout_s": s.health_check_timeout_s, "startup_timeout_s": s.startup_timeout_s,
                "health_check_interval_s": s.health_check_interval_s,
                "health_failure_threshold": s.health_failure_threshold,
                "health_success_threshold": s.health_success_threshold}


def pool(replicas: int, gpus_per_replica: int, kv_tokens: int, max_running_requests: int) -> Pool:
    """The pool of `replicas` equal replicas."""
    return Pool(replicas=replicas, gpus=replicas * gpus_per_replica, kv_tokens=replicas * kv_tokens,
                max_running_requests=replicas * max_running_requests)


def _warn(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="warning", message=message, path=path, hint=hint)


def router_plan(t: Topology, margin: float, longest_prefill: float | str, node: int | None,
                worker_urls: tuple[str, ...]) -> tuple[RouterPlan, list[Issue]]:
    """The router's settings for a topology with a `router` section, and the warnings on values set by hand;
    `longest_prefill` is the performance model's prefill of the longest prompt a replica allows (seconds) or
    why it could not be timed, `margin` the catalog's router_health_margin over it, `node` the index of the
    node it runs on (None: this host), `worker_urls` each instance's engine URL."""
    r = t.router
    assert r is not None
    issues: list[Issue] = []
    prefill = longest_prefill if isinstance(longest_prefill, float) else None
    sized = HEALTH_TIMEOUT_UNKNOWN_S if prefill is None else max(
        HEALTH_TIMEOUT_FLOOR_S, math.ceil(margin * prefill))
    if r.health_check_timeout_s is not None and prefill is not None and r.health_check_timeout_s <= prefill:
        issues.append(_warn("ROUTER_HEALTH_TIMEOUT", f"health_check_timeout_s {r.health_check_timeout_s} is not "
                            f"above the longest prefill a replica allows (~{prefill:.1f} s for "
                            f"{t.serving.context_length:,} tokens): a health check waiting behind it takes the "
                            "replica out", "router.health_check_timeout_s", f"remove it (the plan sizes {sized} s)"))
    ready = t.launch.ready_timeout_s
    startup = ready + max(60, ready // 10)
    if r.startup_timeout_s is not None and r.startup_timeout_s <= ready:
        issues.append(_warn("ROUTER_STARTUP_TIMEOUT", f"startup_timeout_s {r.startup_timeout_s} is not above "
                            f"launch.ready_timeout_s {ready} (the load time the deployment allows): the router "
                            "gives up on a replica still loading", "router.startup_timeout_s",
                            f"remove it (the plan sizes {startup} s)"))
    listen = r.listen or ("127.0.0.1" if node is None else t.nodes[node].ip)
    settings = RouterSettings(
        kind=r.kind, listen=listen, port=r.port, worker_urls=worker_urls, policy=r.policy,
        health_failure_threshold=r.health_failure_threshold, health_success_threshold=r.health_success_threshold,
        health_check_interval_s=r.health_check_interval_s,
        health_check_timeout_s=r.health_check_timeout_s or sized, startup_timeout_s=r.startup_timeout_s or startup,
        metrics_port=r.metrics_port)
    runs_on = "local" if node is None else f"{t.nodes[node].host} ({t.nodes[node].ip})"
    return RouterPlan(settings=settings, runs_on=runs_on, longest_prefill_s=prefill,
                      prefill_unknown=None if prefill is not None else str(longest_prefill)), issues


def policy_issues(t: Topology, choices: tuple[str, ...]) -> list[Issue]:
    """A policy the chosen router does not have (`choices`: the ones it has; an input error)."""
    r = t.router
    if r is None:
        return []
    if r.policy in choices:
        return []
    return [Issue(code="ROUTER_POLICY", severity="error", path="router.policy",
                  message=f"{r.kind} has no policy '{r.policy}'", hint=f"one of {', '.join(choices)}")]
