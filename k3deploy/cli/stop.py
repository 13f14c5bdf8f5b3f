"""`k3deploy stop`: stop the supervisor, then every node of a deployment; idempotent."""
from __future__ import annotations

from typing import Annotated

import typer

from k3deploy.cli.status import StateDirOpt


def stop(
    deployment: Annotated[str, typer.Argument(help="deployment name or its topology file", show_default=False)],
    state_dir: StateDirOpt = None,
) -> None:
    """Stop a deployment from any shell: supervisor first (no restarts), then each node's process group
    (SIGTERM, then SIGKILL after launch.stop_grace_s). Of replicas behind a router: the router, then every
    replica. Exit 3 if a node could not be reached."""
    from k3deploy.errors import ExecError
    from k3deploy.executors.factory import open_executor
    from k3deploy.launch.unit import stop_unit
    from k3deploy.records.locate import locate

    found = locate(deployment, str(state_dir) if state_dir else None)
    status, stopped = stop_unit(found.store, found.name, open_executor)
    for s in stopped:
        print(f"{_part(s.part)}rank {s.rank} {s.host}: {s.what}")
    print(f"{found.name}: {status}")
    bad = next((s for s in stopped if s.what != "stopped"), None)
    if bad is not None:
        raise ExecError(f"could not stop {_part(bad.part)}rank {bad.rank}: {bad.what}", host=bad.host,
                        hint="run `k3deploy stop` again once the host is reachable")


def _part(name: str) -> str:
    return f"{name} " if name else ""
