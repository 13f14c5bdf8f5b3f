"""`k3deploy rollout`: restart replicas behind their router one at a time, never fewer than N-1 serving."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from k3deploy.cli.common import (
    CatalogOpt,
    ExecutorOpt,
    exec_overrides,
    with_connection_options,
)
from k3deploy.cli.status import StateDirOpt


@with_connection_options
def rollout(
    target: Annotated[str, typer.Argument(help="the service's topology file (its current content is applied), "
                                          "or its name (the file it was launched from)", show_default=False)],
    drain_s: Annotated[float, typer.Option("--drain-s", min=1, help="longest wait for a replica's in-flight "
                                           "requests")] = 120.0,
    skip_short: Annotated[bool, typer.Option("--skip-short", help="put each new replica back without its `short` "
                                             "validate stage (a model that cannot pass it, e.g. random weights "
                                             "that never stop)")] = False,
    executor: ExecutorOpt = None,
    state_dir: StateDirOpt = None,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """One replica at a time: out of the router (drained), stopped, started, a real completion and the `short`
    validate stage straight to it, back in and healthy. Exit 4 at the first failure, naming the replica and
    stage (the others keep serving)."""
    from k3deploy.launch.lookup import locate
    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.rollout import rollout as roll
    from k3deploy.launch.service_state import ServiceStore
    from k3deploy.launch.service_views import summary
    from k3deploy.validate.replica_check import replica_stage

    store, name = locate(target, str(state_dir) if state_dir else None)
    svc = ServiceStore(store).load(name)
    file = Path(target) if Path(target).suffix in (".yaml", ".yml") or Path(target).is_file() else \
        Path(svc.file) if svc is not None else Path(target)
    overrides = exec_overrides({"executor": executor, **connection})
    prep = prepare(file, catalog, overrides)
    if prep.service is None:
        from k3deploy.errors import InputError

        raise InputError(f"{file} has no replicas behind a router: nothing to roll out",
                         hint=f"k3deploy stop {name}, then k3deploy launch {file}")
    if prep.service.roles:
        from k3deploy.errors import InputError

        raise InputError(f"{file}: rollout of prefill/decode roles is not built yet",
                         hint=f"k3deploy stop {name}, then k3deploy launch {file}")
    done = roll(prep.service, store, say=lambda line: print(line, file=sys.stderr), drain_s=drain_s,
                checks=[] if skip_short else [("short", replica_stage(prep.service, store, "short"))])
    print(summary(done))
