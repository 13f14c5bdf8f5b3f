"""`k3deploy logs`: node-prefixed logs, live from the nodes or from the local copies kept at stop."""
from __future__ import annotations

import sys
from typing import Annotated

import typer

from k3deploy.cli.status import StateDirOpt


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
    from k3deploy.launch import lookup
    from k3deploy.records.locate import locate

    found = locate(deployment, str(state_dir) if state_dir else None)
    store, name = found.store, found.name
    ranks = list(node) if node else None
    from k3deploy.records.service import ServiceStore

    svc = ServiceStore(store).load(name)
    if svc is not None and not follow:
        for part in (*(r.name for r in svc.replicas), *((svc.router_name,) if svc.router_name else ())):
            if store.load(part) is None:
                continue
            for entry in lookup.logs(store, part, open_executor, ranks, lines):
                print(f"==> {part} rank {entry.rank} {entry.host} ({entry.source}) <==", file=sys.stderr)
                for line in entry.text.splitlines():
                    print(f"[{part} {entry.rank} {entry.host}] {line}")
                _name_cause(entry.text, entry.rank, entry.host)
        return
    if svc is not None:
        from k3deploy.errors import InputError

        raise InputError(f"{name} is replicas behind a router: follow one of them",
                         hint=f"k3deploy logs {svc.replicas[0].name} --follow")
    if follow:
        from k3deploy.launch.follow import follow as follow_logs
        from k3deploy.launch.follow import prefixed

        follow_logs(store, name, prefixed(sys.stdout), ranks, lines)
        return
    for entry in lookup.logs(store, name, open_executor, ranks, lines):
        print(f"==> rank {entry.rank} {entry.host} ({entry.source}) <==", file=sys.stderr)
        for line in entry.text.splitlines():
            print(f"[{entry.rank} {entry.host}] {line}")
        _name_cause(entry.text, entry.rank, entry.host)


def _name_cause(text: str, rank: int, host: str) -> None:
    """The failure catalog's cause and fix of what a node's log shows, on stderr beside the log's header."""
    from k3deploy.engines.failures import root_cause

    found = root_cause(text, {"rank": str(rank), "host": host})
    if found is not None:
        print(f"==> rank {rank} {host}: {found.summary()} <==", file=sys.stderr)
