"""Rich renderables of a service (replicas behind a router): launch summary, status; the CLI prints."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

    from k3deploy.launch.service_status import ServiceReport
    from k3deploy.records.service import Service

_STYLE = {"ready": "green", "degraded": "yellow", "failed": "bold red", "stopped": "yellow", "starting": "cyan"}


def summary(svc: Service) -> str:
    """One paragraph after a launch."""
    lines = [f"{svc.name}: {svc.status}; router {svc.router_kind} {svc.router_url}"]
    for r in svc.replicas:
        served = ", answered through the router" if r.served_through_router else ""
        lines.append(f"  {r.name} {r.url}: {r.phase}{served}" + (f": {r.cause}" if r.cause else ""))
    return "\n".join(lines)


def status_view(rep: ServiceReport) -> RenderableType:
    """`k3deploy status NAME` of a service: the service, each replica as k3deploy and the router see it."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    head.add_row("service", rep.name)
    head.add_row("status", Text(rep.status, style=_STYLE.get(rep.status, "")))
    router = "gone" if rep.router is None else f"{rep.router.status}" + (
        "" if rep.router_alive else ", its process is not running")
    head.add_row("router", f"{rep.router_kind} {rep.router_url} ({router})"
                 + (f": {rep.workers_error}" if rep.workers_error else ""))
    table = Table()
    for col in ("instance" if any(r.role for r in rep.replicas) else "replica", "url", "k3deploy", "nodes alive",
                "router says"):
        table.add_column(col)
    for r in rep.replicas:
        alive = "-" if r.report is None else f"{sum(1 for n in r.report.nodes if n.alive)}/{len(r.report.nodes)}"
        table.add_row(r.name, r.url, Text(r.status, style=_STYLE.get(r.status, "")), alive,
                      Text(r.router_says, style="green" if r.router_says.startswith("healthy") else "bold red"))
    parts: list[RenderableType] = [head, table]
    for r in rep.replicas:
        if r.problem:
            parts.append(Text.assemble((f"{r.role or 'replica'} ", "bold red"), f"{r.name}: {r.problem}"))
    if rep.router_problem:
        parts.append(Text.assemble(("router: ", "bold red"), rep.router_problem))
    if rep.status == "failed" and rep.cause:
        parts.append(Text.assemble(("failed: ", "bold red"), rep.cause))
    return Group(*parts)
