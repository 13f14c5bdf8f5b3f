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
    """Print the end of each node's log, every line prefixed with `[rank host]`."""
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch import lookup

    store, name = lookup.locate(deployment, str(state_dir) if state_dir else None)
    ranks = list(node) if node else None
    if follow:
        _follow(store, name, ranks, lines)
        return
    for entry in lookup.logs(store, name, open_executor, ranks, lines):
        print(f"==> rank {entry.rank} {entry.host} ({entry.source}) <==", file=sys.stderr)
        for line in entry.text.splitlines():
            print(f"[{entry.rank} {entry.host}] {line}")


def _follow(store: object, name: str, ranks: list[int] | None, lines: int) -> None:
    from k3deploy.errors import StateError
    from k3deploy.launch.deploy import fleet_of
    from k3deploy.launch.state import ACTIVE, StateStore
    from k3deploy.launch.streaming import LogStreamer

    assert isinstance(store, StateStore)
    dep = store.require(name)
    if dep.status not in ACTIVE:
        raise StateError(f"{name} is {dep.status}: nothing to follow", hint=f"k3deploy logs {name}")
    fleet = fleet_of([j for j in dep.jobs if ranks is None or j.rank in ranks])

    def handles() -> dict[int, object]:
        current = store.load(name)
        return {n.rank: n.handle for n in current.nodes if n.handle is not None} if current else {}

    def sink(rank: int, host: str, line: str) -> None:
        sys.stdout.write(f"[{rank} {host}] {line}\n")
        sys.stdout.flush()

    streamer = LogStreamer(fleet, handles, sink, tail_lines=lines).start()  # type: ignore[arg-type]
    try:
        for _ in range(10**9):  # until Ctrl-C, or every stream ended and the deployment is no longer active
            if streamer.wait(1.0):
                break
            current = store.load(name)
            if current is None or current.status not in ACTIVE:
                break
    finally:
        streamer.stop()
        fleet.close()
