"""NodeJob, the one per-node record: what runs where (argv, env, the shell text, the engine's interpreter, log
path, readiness, executor target), made once by launch's preparation, JSON-able (it is in the state file)."""
from __future__ import annotations

import posixpath
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.catalog.specs import Catalog
from k3deploy.executors.target import ExecTarget
from k3deploy.nodeplan.targets import ExecOverrides, targets_for
from k3deploy.planning.plan import Plan

if TYPE_CHECKING:
    from k3deploy.engines.context import Inputs
    from k3deploy.topology.schema import Topology
    from k3deploy.topology.units import UnitInstance


class ReadyCheck(BaseModel):
    """How a node shows it is up (the renderer's ReadySpec, as data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(description="http (its paths, then a completion) | health (its paths only: a PD role, "
                      "whose completion goes through the router) | dummy-health | none")
    url: str | None = None
    paths: tuple[str, ...] = ()


class NodeJob(BaseModel):
    """One node's process: the quoted shell text the node runs and where its output goes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    host: str
    ip: str
    iface: str = Field("", description="the private interface `ip` must be on (empty in records before 0.2)")
    head: bool
    command: str = Field(description="POSIX shell text from the renderer (every topology value quoted)")
    argv: tuple[str, ...] = Field((), description="the engine's argv (empty in records before 0.3)")
    env: dict[str, str] = Field(default_factory=dict, description="plain environment values the engine gets "
                                "(secrets stay references, in `command`)")
    engine_python: str | None = Field("python3", description="the engine's interpreter on the node; None: it is "
                                      "inside a container image")
    log_path: str
    container: str | None = None
    ready: ReadyCheck
    target: ExecTarget

    def tag(self, deployment: str, run_id: str) -> str:
        """The value marking this node's processes of one group start."""
        return f"{deployment}.{self.rank}.{run_id}"


def log_path(log_dir: str, deployment: str, rank: int) -> str:
    """Log file of one node: under launch.log_dir, named by deployment and rank."""
    return posixpath.join(log_dir, f"{deployment}-rank{rank}.log")


def engine_python(argv: Sequence[str]) -> str | None:
    """The interpreter of the engine's argv: a python itself, the python beside a console script, or the
    first python3 on PATH for a bare command; None for docker (the interpreter is inside the image)."""
    first = argv[0] if argv else "python3"
    base = posixpath.basename(first)
    if base == "docker":
        return None
    if base.startswith("python"):
        return first
    return posixpath.join(posixpath.dirname(first), "python3") if "/" in first else "python3"


def jobs_for(plan: Plan, overrides: ExecOverrides | None = None,
             catalog: Catalog | None = None, replica: int = 0) -> tuple[NodeJob, ...]:
    """Render every node (rank 0 first) of one replica (the only one without replicas) and pair it with its
    executor target."""
    from k3deploy.topology.replicas import replica_topology

    return _jobs(plan, replica_topology(plan.topology, replica), lambda python: plan.render_inputs(python, replica),
                 overrides, catalog)


def instance_jobs(plan: Plan, inst: UnitInstance, overrides: ExecOverrides | None = None,
                  catalog: Catalog | None = None) -> tuple[NodeJob, ...]:
    """Every node (rank 0 first) of one of the plan's instances (a deployment's one, a replica, or a prefill or
    decode instance with its role's flags and env). A role's head is ready once it answers its health paths: a
    request to one role alone has no pair, so the completion that makes the service ready goes through the
    router."""
    jobs = _jobs(plan, inst.topology, lambda python: plan.instance_inputs(inst, python), overrides, catalog)
    if not inst.role:
        return jobs
    return tuple(j.model_copy(update={"ready": j.ready.model_copy(update={"kind": "health"})})
                 if j.ready.kind == "http" else j for j in jobs)


def _jobs(plan: Plan, t: Topology, inputs: Callable[[str], Inputs], overrides: ExecOverrides | None,
          catalog: Catalog | None) -> tuple[NodeJob, ...]:
    from k3deploy.engines.render import render_nodes
    from k3deploy.engines.shell import node_shell

    targets = targets_for(t, overrides)
    vendor = catalog.vendors.get(plan.hardware.vendor) if catalog and plan.hardware else None
    # Nodes that are this machine run the stand-in under this interpreter, not the first python3 on PATH.
    here = all(tg.capabilities.node_is_here for tg in targets.values())
    python = sys.executable if here else "python3"
    inp = inputs(python)
    return tuple(
        NodeJob(
            rank=s.rank, host=s.host, ip=s.ip, iface=s.node.iface, head=s.head, command=node_shell(s),
            argv=s.argv, env=dict(s.env), engine_python=engine_python(s.argv),
            log_path=log_path(t.launch.log_dir, t.name, s.rank), container=s.container,
            ready=ReadyCheck(kind=s.ready.kind, url=s.ready.url, paths=s.ready.paths), target=targets[s.rank],
        )
        for s in render_nodes(inp, vendor)
    )
