"""`k3deploy status`: per-node alive/ready, uptime and the recorded failure of a deployment."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

StateDirOpt = Annotated[Path | None, typer.Option(
    "--state-dir", help="deployment records (default: the topology's launch.state_dir, else $XDG_STATE_HOME/k3deploy)")]


def status(
    deployment: Annotated[str, typer.Argument(help="deployment name or its topology file", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    state_dir: StateDirOpt = None,
) -> None:
    """Show a deployment: status, supervisor, each node's process, rank 0 serving, the failure if any.
    Of replicas behind a router: each replica beside what the router's /workers says of it, and the router.
    Exit 4 when the deployment failed (a service: when nothing serves)."""
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.unit import unit_status, unit_view
    from k3deploy.records.locate import locate

    found = locate(deployment, str(state_dir) if state_dir else None)
    report = unit_status(found.store, found.name, open_executor)
    # A failed deployment is not success for a script asking `k3deploy status x && ...` (README: exit 4).
    code = 4 if report.status == "failed" else 0
    if as_json:
        print(report.model_dump_json(indent=2))
        raise typer.Exit(code)
    from rich.console import Console

    console = Console(highlight=False, markup=False, emoji=False)
    view, whole_lines = unit_view(report)
    console.print(view)
    for line in whole_lines:
        console.print(line, soft_wrap=True)
    raise typer.Exit(code)
