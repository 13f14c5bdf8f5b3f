"""Rich renderables for launch progress, dry runs, status and stop; the CLI prints them."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from k3deploy.launch.events import GROUP, NodeEvent
from k3deploy.nodeplan.jobs import NodeJob

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

    from k3deploy.launch.lookup import StatusReport
    from k3deploy.records.deployment import Deployment

_STYLE = {"ready": "green", "loading": "cyan", "started": "cyan", "failed": "bold red", "unreachable": "bold red",
          "stopped": "yellow", "stopping": "yellow", "restarting": "magenta"}


class Progress:
    """Per-node phase table of every part of a unit (`part` "" for a deployment alone, else the instance's or the
    router's deployment name), updated from events (any thread)."""

    def __init__(self, parts: Sequence[tuple[str, Sequence[NodeJob]]]) -> None:
        self.t0 = time.monotonic()
        self.rows = {(part, j.rank): [j.host, "pending", "", 0.0] for part, jobs in parts for j in jobs}
        self.notes: list[str] = []
        self._lock = threading.Lock()

    def update(self, part: str, event: NodeEvent) -> None:
        """Record an event of the part's deployment."""
        with self._lock:
            if event.rank == GROUP or (part, event.rank) not in self.rows:
                self.notes.append(f"{event.phase}: {event.detail}")
                return
            row = self.rows[(part, event.rank)]
            row[1], row[2], row[3] = event.phase, event.detail, time.monotonic() - self.t0

    def table(self) -> Table:
        """The current table."""
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"launch ({time.monotonic() - self.t0:.1f} s)", title_justify="left")
        for col in ("rank", "host", "phase", "at", "detail"):
            table.add_column(col)
        with self._lock:
            for (part, rank), (host, phase, detail, at) in sorted(self.rows.items()):
                style = _STYLE.get(str(phase), "")
                table.add_row(f"{part} {rank}".lstrip(), Text(str(host)), Text(str(phase), style=style),
                              f"{at:.1f} s" if at else "", Text(str(detail)[:100]))
        return table


def event_line(event: NodeEvent, part: str = "") -> str:
    """One line per event, for logs and non-terminal output (prefixed with its part's name, a service's)."""
    who = "group" if event.rank == GROUP else f"rank {event.rank} {event.host}"
    return f"{part} {who}".lstrip() + f": {event.phase}" + (f" ({event.detail})" if event.detail else "")


def dry_run(parts: Sequence[tuple[str, Sequence[NodeJob]]], router: NodeJob | None) -> RenderableType:
    """What would run where, touching nothing: each part's nodes (under the part's title, a service's), per node a
    header line, then the exact shell text; then the router, a service's."""
    from rich.console import Group
    from rich.text import Text

    out: list[RenderableType] = []
    for title, jobs in parts:
        if title:
            out.append(Text(f"# ===== {title} =====", style="bold"))
        for j in jobs:
            via = j.target.via()
            where = f"ip {j.ip} on {j.iface}" if j.iface else f"ip {j.ip}"
            out.append(Text(f"# rank {j.rank} on {j.host} ({where}) via {via}; log {j.log_path}", style="bold"))
            out.append(Text("".join(f"  {line}\n" for line in j.command.splitlines())))
    if router is not None:
        out += [Text(f"# ===== router {router.ready.url} on {router.host} via {router.target.via()}; log "
                     f"{router.log_path} =====", style="bold"), Text(f"  {router.command}\n")]
    return Group(*out)


def deployment_summary(dep: Deployment) -> str:
    """One paragraph after a launch."""
    ready = dep.attempts[-1].ready_at if dep.attempts else None
    took = f" in {ready - dep.attempts[-1].started_at:.1f} s" if ready else ""
    owner = f"; supervisor pid {dep.owner.pid}" if dep.owner and dep.owner.role == "supervisor" else ""
    return f"{dep.name}: {dep.status}{took}; {dep.url or ''}{owner}"


def status_view(rep: StatusReport) -> RenderableType:
    """`k3deploy status`."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Table.grid(padding=(0, 2))
    head.add_row("deployment", rep.name)
    head.add_row("status", Text(rep.status, style=_STYLE.get(rep.status, "")))
    asked = ", checked on rank 0" if rep.probe_from == "head" else ""
    serving = "serving" if rep.ready else "not serving"
    why = f": {rep.ready_detail}" if rep.ready is False and rep.ready_detail else ""
    head.add_row("url", f"{rep.url or '-'} ({serving}{asked}{why})")
    unwatched = not rep.supervised and rep.status in ("starting", "ready", "restarting")
    head.add_row("supervisor", f"pid {rep.supervisor_pid}" if rep.supervised else Text(
        f"none running: nothing stops the other nodes if one dies (k3deploy stop {rep.name}, then launch again)",
        style="bold yellow") if unwatched else "none running")
    head.add_row("uptime", f"{rep.uptime_s:.0f} s" if rep.uptime_s is not None else "-")
    head.add_row("plan", f"{rep.file} ({rep.plan_digest}), executor {rep.executor}")
    head.add_row("attempts", str(len(rep.attempts)))
    if rep.slurm:
        head.add_row("slurm", rep.slurm)
    nodes = Table()
    for col in ("rank", "host", "pid", "alive"):  # log paths: whole lines after the view (see cli/status)
        nodes.add_column(col)
    for n in rep.nodes:
        alive = Text({True: "yes", False: "no", None: "?"}[n.alive] + (f" ({n.error})" if n.error else ""),
                     style="green" if n.alive else "")
        nodes.add_row(str(n.rank), Text(n.host), str(n.pid or "-"), alive)
    parts: list[RenderableType] = [head, nodes]
    left = [n for n in rep.nodes if n.phase == "unknown" and n.alive is not False]
    if left and rep.status not in ("starting", "ready", "restarting"):
        where = ", ".join(f"rank {n.rank} ({n.host})" for n in left)
        state = "still runs" if all(n.alive for n in left) else "could not be stopped and may still run"
        parts.append(Text(f"{where} {state}: k3deploy stop {rep.name}", style="bold yellow"))
    if rep.failure is not None:
        f = rep.failure
        who = f"rank {f.rank} ({f.host})" if f.rank is not None else "deployment"
        parts.append(Text.assemble(("failed: ", "bold red"), f"{who}: {f.cause}"))
        if f.log_tail.strip():
            parts.append(Text("\n".join(f.log_tail.rstrip().splitlines()[-15:])))
    return Group(*parts)
