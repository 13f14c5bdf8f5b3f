"""What preflight needs of each node: its addresses, the rendered environment and the engine's interpreter."""
from __future__ import annotations

import posixpath
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from k3deploy.catalog.specs import Catalog
from k3deploy.engines.render import render_nodes
from k3deploy.launch.jobs import NodeJob
from k3deploy.planning.plan import Plan


@dataclass(frozen=True)
class NodeInput:
    """One node as the engine will see it: rank, addresses, interface, env, and the engine's python."""

    rank: int
    host: str
    ip: str
    iface: str
    head_ip: str
    env: dict[str, str] = field(default_factory=dict)
    engine_python: str | None = "python3"  # None: the engine runs in a container image


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


def node_inputs(plan: Plan, jobs: Sequence[NodeJob], catalog: Catalog | None = None) -> dict[int, NodeInput]:
    """Every node's inputs from the same render `launch` uses (so the probe gets the engine's env)."""
    vendor = catalog.vendors.get(plan.hardware.vendor) if catalog and plan.hardware else None
    # As jobs_for: local nodes are this machine, so the stand-in runs under this interpreter.
    local = all(j.target.kind == "local" for j in jobs)
    specs = render_nodes(plan.render_inputs(sys.executable if local else "python3"), vendor)
    head_ip = next(s.ip for s in specs if s.head)
    return {s.rank: NodeInput(rank=s.rank, host=s.host, ip=s.ip, iface=s.node.iface, head_ip=head_ip,
                              env=dict(s.env), engine_python=engine_python(s.argv)) for s in specs}
