"""NodeJob: what runs where (rendered command, log path, readiness, executor target), JSON-able."""
from __future__ import annotations

import posixpath
import sys

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.catalog.specs import Catalog
from k3deploy.executors.target import ExecTarget
from k3deploy.launch.targets import ExecOverrides, targets_for
from k3deploy.planning.plan import Plan


class ReadyCheck(BaseModel):
    """How a node shows it is up (the renderer's ReadySpec, as data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(description="http | dummy-health | none")
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


def jobs_for(plan: Plan, overrides: ExecOverrides | None = None,
             catalog: Catalog | None = None) -> tuple[NodeJob, ...]:
    """Render every node (rank 0 first) and pair it with its executor target."""
    from k3deploy.engines.render import render_nodes
    from k3deploy.engines.shell import node_shell

    t = plan.topology
    targets = targets_for(t, overrides)
    vendor = catalog.vendors.get(plan.hardware.vendor) if catalog and plan.hardware else None
    # Local nodes are this machine: the stand-in runs under this interpreter, not the first python3 on PATH.
    python = sys.executable if all(tg.kind == "local" for tg in targets.values()) else "python3"
    return tuple(
        NodeJob(
            rank=s.rank, host=s.host, ip=s.ip, iface=s.node.iface, head=s.head, command=node_shell(s),
            log_path=log_path(t.launch.log_dir, t.name, s.rank), container=s.container,
            ready=ReadyCheck(kind=s.ready.kind, url=s.ready.url, paths=s.ready.paths), target=targets[s.rank],
        )
        for s in render_nodes(plan.render_inputs(python), vendor)
    )
