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
    """Show a deployment: status, supervisor, each node's process, rank 0 serving, the failure if any."""
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.lookup import locate
    from k3deploy.launch.lookup import status as get_status

    store, name = locate(deployment, str(state_dir) if state_dir else None)
    report = get_status(store, name, open_executor)
    if as_json:
        print(report.model_dump_json(indent=2))
        return
    from rich.console import Console

    from k3deploy.launch.views import status_view

    Console(highlight=False).print(status_view(report))
