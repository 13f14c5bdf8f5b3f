"""The router's NodeJob: the real router's command (as the plan rendered it, with the replicas it should front)
on the machine `router.runs_on` names, so launch, status, logs and stop treat it as a one-node deployment."""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from k3deploy.engines.router import router_argv
from k3deploy.executors.target import ExecTarget, LocalTarget
from k3deploy.nodeplan.jobs import NodeJob, ReadyCheck, log_path
from k3deploy.nodeplan.targets import ExecOverrides, targets_for
from k3deploy.planning.plan import Plan
from k3deploy.topology.replicas import router_node

# Ready is a real completion through the router (head readiness asks the paths, then /v1/completions).
ROUTER_READY_PATHS = ("/health",)


def router_name(service: str) -> str:
    """The router's deployment record name."""
    return f"{service}-router"


def router_job(plan: Plan, worker_urls: Sequence[str], overrides: ExecOverrides | None = None) -> NodeJob:
    """The router fronting `worker_urls` (the ready replicas), on its node via that node's executor or here."""
    t, rp = plan.topology, plan.router
    if t.router is None or rp is None:
        raise ValueError(f"{plan.file}: no router section")
    settings = dataclasses.replace(rp.settings, worker_urls=tuple(worker_urls))
    argv = router_argv(settings, t.router.python)
    index = router_node(t)
    if index is None:
        target: ExecTarget = LocalTarget(host="localhost")
        host = "localhost"
    else:
        node = t.nodes[index]
        one = t.model_copy(update={"nodes": [node.model_copy(update={"rank": None})], "replicas": 1,
                                   "replica_nodes": None, "router": None})
        target, host = targets_for(one, overrides)[0], node.host
    return NodeJob(rank=0, host=host, ip=settings.listen, head=True, command="set -eu\nexec " + shlex.join(argv),
                   argv=argv, env={}, engine_python=t.router.python,
                   log_path=log_path(t.launch.log_dir, router_name(t.name), 0),
                   ready=ReadyCheck(kind="http", url=settings.url, paths=ROUTER_READY_PATHS), target=target)
