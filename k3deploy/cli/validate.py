"""`k3deploy validate`: the staged checklist against a topology file or a running deployment."""
# No `from __future__ import annotations`: typer evaluates the command's annotations on every run.
from pathlib import Path
from typing import Annotated

import typer

from k3deploy.cli.common import CatalogOpt

StageOpt = Annotated[list[str] | None, typer.Option(
    "--only", help="run only these stages (repeat or comma-separate); order: shards, kernels, topology, short, long, "
    "prefix-cache, effort")]


def validate(
    target: Annotated[str, typer.Argument(help="topology file, or the name of a launched deployment",
                                          show_default=False)],
    only: StageOpt = None,
    start: Annotated[str | None, typer.Option("--from", help="start at this stage (and run the ones after it)")] = None,
    skip: Annotated[list[str] | None, typer.Option("--skip", help="leave these stages out")] = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="skip the remaining stages after one fails")] = False,
    manifest: Annotated[Path | None, typer.Option(help="checkpoint manifest (default: the topology's "
                                                  "validate.manifest)")] = None,
    accuracy_dataset: Annotated[Path | None, typer.Option(
        "--accuracy-dataset", help="the accuracy stage's dataset file (default: the topology's "
        "validate.accuracy_dataset)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON (contract in README)")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="also write JUnit XML here (one testcase per stage "
                                               "and node)")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="also write a self-contained HTML report here: every "
                                              "stage with its evidence, the load's distributions against the "
                                              "prediction (needs the 'report' extra)")] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="deployment records (default: the "
                                                   "topology's launch.state_dir, else $XDG_STATE_HOME/k3deploy)")] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Validate a deployment stage by stage. Exit 0 passed, 1 a stage failed, 2 invalid input, 3 host error,
    5 no such deployment."""
    from rich.console import Console

    from k3deploy.validate.live import live_progress
    from k3deploy.validate.nodes import fleet_runner
    from k3deploy.validate.report import report_table, write_junit
    from k3deploy.validate.run import load_manifest, resolve_target, with_accuracy_dataset
    from k3deploy.validate.run import validate as run_validate

    if html is not None:
        from k3deploy.extras import require

        require("report", what="--html")
    found = with_accuracy_dataset(resolve_target(target, str(state_dir) if state_dir else None), accuracy_dataset)
    pinned = load_manifest(found.topology, found.file, manifest)
    with live_progress(Console(stderr=True, highlight=False)) as live:
        report = run_validate(found, fleet_runner, manifest=pinned, only=only or (), start=start, skip=skip or (),
                              fail_fast=fail_fast, catalog_dirs=catalog or (), progress=live.update,
                              on_stage=live.stage)
    if junit is not None:
        write_junit(report, junit)
    if html is not None:
        from k3deploy.html_report.page import write_page
        from k3deploy.html_report.validate_page import validate_page

        write_page(html, validate_page(report))
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        Console(highlight=False, soft_wrap=True).print(report_table(report))
    raise typer.Exit(report.exit_code)
