"""`k3deploy logs`: node-prefixed logs, live from the nodes or from the local copies kept at stop."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from k3deploy.cli.status import StateDirOpt

if TYPE_CHECKING:
    from k3deploy.launch.lookup import NodeLog


def logs(
    deployment: Annotated[str, typer.Argument(help="deployment name or its topology file", show_default=False)],
    node: Annotated[list[int] | None, typer.Option("--node", help="node rank (repeatable); default all")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep streaming until Ctrl-C or the "
                                         "processes end")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=1, help="lines per node")] = 50,
    state_dir: StateDirOpt = None,
) -> None:
    """Print the end of each node's log, every line prefixed with `[rank host]` (replicas behind a router:
    every replica's and the router's, prefixed `[NAME-rI rank host]`)."""
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.unit import follow_unit, unit_logs
    from k3deploy.records.locate import locate

    found = locate(deployment, str(state_dir) if state_dir else None)
    ranks = list(node) if node else None
    if follow:
        from k3deploy.launch.follow import prefixed

        follow_unit(found.store, found.name, prefixed(sys.stdout), ranks, lines)
        return
    for part, entry in unit_logs(found.store, found.name, open_executor, ranks, lines):
        who = f"{part} " if part else ""
        print(f"==> {who}rank {entry.rank} {entry.host} ({entry.source}) <==", file=sys.stderr)
        for line in entry.text.splitlines():
            print(f"[{who}{entry.rank} {entry.host}] {line}")
        _name_cause(entry)


def _name_cause(entry: NodeLog) -> None:
    """The failure catalog's cause and fix of what a node's log shows (as launch and status name it), on
    stderr beside the log's header."""
    from k3deploy.serving.readiness import KNOWN_CAUSE, known_cause

    named = known_cause(entry.text, entry.rank, entry.host, entry.ip, entry.iface)
    if named:
        print(f"==> rank {entry.rank} {entry.host}: {named.removeprefix(KNOWN_CAUSE)} <==", file=sys.stderr)
