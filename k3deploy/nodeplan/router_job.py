"""The router's NodeJob: the real router's command (as the plan rendered it, fronting every instance; narrowed at
launch to the ready ones) on the machine `router.runs_on` names, so launch, status, logs and stop treat it as a
one-node deployment."""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from k3deploy.engines.router import RouterSettings, router_argv
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


def router_deployment(plan: Plan, overrides: ExecOverrides | None = None) -> tuple[Plan, NodeJob]:
    """The router as a one-node deployment, worked out once: its plan (its name, file and launch settings) and
    its job fronting every instance, on its node via that node's executor or here."""
    t, rp = plan.topology, plan.router
    if t.router is None or rp is None:
        raise ValueError(f"{plan.file}: no router section")
    settings = rp.settings
    argv = router_argv(settings, t.router.python)
    index = router_node(t)
    # A router run here takes its launch settings from the first instance's head node.
    node = t.nodes[index if index is not None else plan.instances[0].nodes[0]].model_copy(update={"rank": None})
    if index is None:
        target: ExecTarget = LocalTarget(host="localhost")
        host = "localhost"
    else:
        one = t.model_copy(update={"nodes": [node], "replicas": 1, "replica_nodes": None, "router": None})
        target, host = targets_for(one, overrides)[0], node.host
    own = plan._replace(topology=t.model_copy(update={
        "name": router_name(t.name), "nodes": [node], "replicas": 1, "replica_nodes": None, "router": None,
        "roles": None}))
    return own, NodeJob(rank=0, host=host, ip=settings.listen, head=True, command=_command(argv), argv=argv, env={},
                        engine_python=t.router.python, log_path=log_path(t.launch.log_dir, router_name(t.name), 0),
                        ready=ReadyCheck(kind="http", url=settings.url, paths=ROUTER_READY_PATHS), target=target)


def fronting_only(job: NodeJob, settings: RouterSettings, worker_urls: Sequence[str]) -> NodeJob:
    """The router's `job` (rendered from `settings`) fronting only `worker_urls`, the ready instances: its
    worker list and, in PD mode, its --prefill/--decode lists narrowed to them."""
    narrowed = _fronting(settings, worker_urls)
    assert job.engine_python is not None  # router.python, always named
    argv = router_argv(narrowed, job.engine_python)
    return job.model_copy(update={"argv": argv, "command": _command(argv)})


def _fronting(settings: RouterSettings, worker_urls: Sequence[str]) -> RouterSettings:
    urls = tuple(worker_urls)
    return dataclasses.replace(settings, worker_urls=urls, prefill=tuple(p for p in settings.prefill if p[0] in urls),
                               decode=tuple(u for u in settings.decode if u in urls))


def _command(argv: Sequence[str]) -> str:
    return "set -eu\nexec " + shlex.join(argv)
