"""`k3deploy demo`: checkpoint, plan, launch, validate and stop on this machine, in one command."""
# No `from __future__ import annotations`: typer evaluates the command's annotations on every run.
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DIR = Path("/tmp/k3deploy-demo")


def demo(
    workdir: Annotated[Path, typer.Option("--dir", help="where the checkpoint, topology, logs and state go")] = DEFAULT_DIR,
    keep: Annotated[bool, typer.Option("--keep", help="leave the deployment running and say how to reach it")] = False,
) -> None:
    """Write the tiny K3-shaped checkpoint if missing, plan, launch 4 local stand-in nodes, run every validation
    stage, print the report and stop everything. Exit 0 passed, 1 a stage failed, 4 the launch failed."""
    from rich.console import Console

    from k3deploy.demo import DEMO_NAME, run_demo
    from k3deploy.launch.views import event_line
    from k3deploy.validate.live import live_progress
    from k3deploy.validate.report import report_table

    err = Console(stderr=True, highlight=False)
    with live_progress(err) as live:
        result = run_demo(workdir.expanduser().resolve(), keep=keep, progress=live.update, on_stage=live.stage,
                          on_event=lambda e: err.print(event_line(e), markup=False),
                          on_step=lambda s: err.print(f"[bold]demo[/]: {s}"))
    Console(highlight=False, soft_wrap=True).print(report_table(result.report))
    state = result.topology_file.parent / "state"
    if result.kept:
        url = result.deployment.url
        print(f"\n{DEMO_NAME} keeps running at {url} (topology {result.topology_file}):\n"
              f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' "
              "-d '{\"model\": \"kimi-k3-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'\n"
              f"  k3deploy status {DEMO_NAME} --state-dir {state}\n"
              f"  k3deploy logs {DEMO_NAME} --state-dir {state} -n 20\n"
              f"  k3deploy stop {DEMO_NAME} --state-dir {state}")
    else:
        err.print(f"[bold]demo[/]: {DEMO_NAME} stopped; nothing left running (logs in {state.parent / 'logs'})")
    raise typer.Exit(result.report.exit_code)
