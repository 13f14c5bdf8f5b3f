"""`k3deploy top`: a running unit's engines, live from their own /metrics, beside what the plan predicts."""
from __future__ import annotations

import time
from typing import Annotated

import typer

from k3deploy.cli.status import StateDirOpt


def top(
    deployment: Annotated[str, typer.Argument(help="deployment name or its topology file", show_default=False)],
    interval: Annotated[float, typer.Option("--interval", min=1.0, help="seconds between scrapes of each engine "
                                            "(at least 1: a scrape costs the engine a render of every metric)")
                        ] = 2.0,
    window: Annotated[float, typer.Option("--window", min=1.0, help="seconds the rates and means cover")] = 30.0,
    once: Annotated[bool, typer.Option("--once", help="scrape twice, --interval apart, print once and exit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (with --once)")] = False,
    state_dir: StateDirOpt = None,
) -> None:
    """Watch a deployment or service: every instance's and the router's running and waiting requests, KV use,
    prefix-cache hit rate, generated tok/s, TTFT and TPOT over the last --window seconds, each beside what the
    plan predicts at that load and the instance's capacity; an instance lagging the others or its prediction is
    named. A source that cannot be read is named, never shown with old figures. Ctrl-C ends it (exit 0)."""
    from k3deploy.errors import InputError
    from k3deploy.launch.top import Watch, plan_predict
    from k3deploy.launch.top_view import top_view
    from k3deploy.launch.unit import unit_sources
    from k3deploy.records.locate import locate

    if as_json and not once:
        raise InputError("--json prints one report: give --once with it", hint=f"k3deploy top {deployment} --once "
                         "--json")
    found = locate(deployment, str(state_dir) if state_dir else None)
    watch = Watch(found.name, unit_sources(found.store, found.name), window, predict=plan_predict)
    from rich.console import Console

    console = Console(highlight=False, markup=False, emoji=False)
    if once:
        watch.poll()
        time.sleep(interval)
        watch.poll()
        report = watch.report()
        if as_json:
            print(report.model_dump_json(indent=2))
        else:
            console.print(top_view(report))
        return
    from rich.live import Live

    watch.poll()
    try:
        with Live(top_view(watch.report()), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                watch.poll()
                live.update(top_view(watch.report()), refresh=True)
    except KeyboardInterrupt:
        return
