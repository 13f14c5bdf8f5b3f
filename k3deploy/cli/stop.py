"""`k3deploy stop`: stop the supervisor, then every node of a deployment; idempotent."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from k3deploy.records.store import StateStore

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
    from k3deploy.launch import deploy
    from k3deploy.records.locate import locate

    found = locate(deployment, str(state_dir) if state_dir else None)
    store, name = found.store, found.name
    from k3deploy.records.service import ServiceStore

    if ServiceStore(store).load(name) is not None:
        _stop_service(store, name)
        return
    dep, outcome = deploy.stop(store, name, factory=open_executor)
    hosts = {j.rank: j.host for j in dep.jobs}
    for rank, what in sorted(outcome.items()):
        print(f"rank {rank} {hosts[rank]}: {what}")
    print(f"{name}: {dep.status}")
    bad = {rank: what for rank, what in outcome.items() if what != "stopped"}
    if bad:
        rank, what = min(bad.items())
        raise ExecError(f"could not stop rank {rank}: {what}", host=hosts[rank],
                        hint="run `k3deploy stop` again once the host is reachable")


def _stop_service(store: StateStore, name: str) -> None:
    from k3deploy.errors import ExecError
    from k3deploy.launch.service import stop_service

    svc, outcome = stop_service(store, name)
    bad = []
    for dep, ranks in outcome.items():
        for rank, what in sorted(ranks.items()):
            print(f"{dep} rank {rank}: {what}")
            if what != "stopped":
                bad.append(f"{dep} rank {rank}: {what}")
    print(f"{name}: {svc.status}")
    if bad:
        raise ExecError(f"could not stop {bad[0]}", hint="run `k3deploy stop` again once the host is reachable")
