"""`k3deploy status`: per-node alive/ready, uptime and the recorded failure of a deployment."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from k3deploy.records.store import StateStore

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
    from k3deploy.launch.lookup import status as get_status
    from k3deploy.records.locate import locate

    found = locate(deployment, str(state_dir) if state_dir else None)
    store, name = found.store, found.name
    from k3deploy.records.service import ServiceStore

    if ServiceStore(store).load(name) is not None:
        _service_status(store, name, as_json)
    report = get_status(store, name, open_executor)
    # A failed deployment is not success for a script asking `k3deploy status x && ...` (README: exit 4).
    code = 4 if report.status == "failed" else 0
    if as_json:
        print(report.model_dump_json(indent=2))
        raise typer.Exit(code)
    from rich.console import Console

    from k3deploy.launch.views import status_view

    console = Console(highlight=False, markup=False, emoji=False)
    console.print(status_view(report))
    for n in report.nodes:  # one whole line each: a long path wraps in the terminal, never cut or folded
        console.print(f"rank {n.rank} log: {n.log_path}", soft_wrap=True)
    raise typer.Exit(code)


def _service_status(store: StateStore, name: str, as_json: bool) -> None:
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.service_status import service_status

    report = service_status(store, name, open_executor)
    code = 4 if report.status == "failed" else 0
    if as_json:
        print(report.model_dump_json(indent=2))
        raise typer.Exit(code)
    from rich.console import Console

    from k3deploy.launch.service_views import status_view

    Console(highlight=False, markup=False, emoji=False).print(status_view(report))
    raise typer.Exit(code)
