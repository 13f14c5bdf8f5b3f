"""`k3deploy plan`: validate topologies and show legality, per-GPU budget and capacity."""
# No `from __future__ import annotations` here: typer evaluates the command's annotations (twice) on every
# run, and string annotations cost an eval each.
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from k3deploy.cli.common import CatalogOpt
from k3deploy.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    from k3deploy.catalog.specs import Catalog
    from k3deploy.planning.files import FileResult


def plan(
    files: Annotated[list[Path] | None, typer.Argument(help="topology YAML files", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (schema in README)")] = False,
    check: Annotated[bool, typer.Option("--check", help="CI mode: one line per file + GitHub annotations")] = False,
    search: Annotated[bool, typer.Option("--search", help="list every legal shape for --hardware x --gpus")] = False,
    hardware: Annotated[str | None, typer.Option(help="accelerator id (with --search)")] = None,
    gpus: Annotated[int | None, typer.Option(help="number of accelerators (with --search)")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="accelerators per node (with --search)")] = None,
    engine: Annotated[str, typer.Option(help="sglang | vllm | vllm-ascend (with --search)")] = "sglang",
    model: Annotated[str, typer.Option(help="model id (with --search)")] = "kimi-k3",
    catalog: CatalogOpt = None,
) -> None:
    """Check legality and the per-GPU memory budget of topology files. Exit 0 feasible, 1 infeasible, 2 invalid."""
    from k3deploy.planning.files import catalog_for, plan_path

    cat = catalog_for(catalog)
    if search:
        _search(cat, hardware, gpus, gpus_per_node, engine, model, as_json)
        return
    if not files:
        raise InputError("no topology files given", hint="k3deploy plan topologies/*.yaml, or --search")
    results = [plan_path(f, cat) for f in files]
    if as_json:
        from k3deploy.planning.document import invalid_json, plan_json

        docs = [plan_json(r.plan) if r.plan else invalid_json(r.file, list(r.load_issues)) for r in results]
        print(json.dumps(docs if len(docs) > 1 else docs[0], indent=2))
    elif check:
        _check_lines(results)
    else:
        _show(results)
    codes = {r.exit_code for r in results}
    raise typer.Exit(2 if 2 in codes else 1 if 1 in codes else 0)


def _console() -> "Console":
    """Plain-text-safe console: file names and messages are never read as rich markup or :emoji: codes."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, markup=False, emoji=False)


def _show(results: "list[FileResult]") -> None:
    from rich.text import Text

    from k3deploy.planning.report import issues_table, plan_renderable

    console = _console()
    for r in results:
        if r.plan is None:
            console.print(Text.assemble(("INVALID", "bold red"), f" {r.file}"))
            console.print(issues_table(r.file, r.load_issues))
        else:
            console.print(plan_renderable(r.plan))
        console.print()


def _check_lines(results: "list[FileResult]") -> None:
    for r in results:
        errors = [i for i in r.issues if i.severity == "error"]
        warnings = [i for i in r.issues if i.severity == "warning"]
        status = {0: "ok", 1: "infeasible", 2: "invalid"}[r.exit_code]
        detail = f"{len(errors)} error(s), {len(warnings)} warning(s)"
        if r.plan is not None and r.plan.shape is not None and r.exit_code == 0:
            s = r.plan.shape
            detail = f"TP{s.tp}/EP{s.ep}/DP{s.dp}/PP{s.pp} on {s.nnodes}x{s.gpus_per_node}; " + detail
        print(f"{status:<10} {r.file}: {detail}")
        for i in errors + warnings:
            level = "error" if i.severity == "error" else "warning"
            loc = f"file={r.file}" + (f",line={i.line},col={i.column or 1}" if i.line else "")
            text = i.render(r.file).replace("%", "%25").replace("\n", "%0A")
            print(f"::{level} {loc},title={i.code}::{text}")


def _search(cat: "Catalog", hardware: str | None, gpus: int | None, per_node: int | None,
            engine: str, model: str, as_json: bool) -> None:
    from k3deploy.engines.kinds import FLAVOURS, engine_family
    from k3deploy.planning.search import search_shapes

    if hardware is None or gpus is None:
        raise InputError("--search needs --hardware and --gpus", hint="e.g. --search --hardware h100-80gb --gpus 32")
    if engine not in FLAVOURS:
        raise InputError(f"--engine {engine}: expected {', '.join(FLAVOURS)}")
    rows = search_shapes(cat, model_id=model, hardware_id=hardware, gpus=gpus,
                         family=engine_family(engine), gpus_per_node=per_node, engine_id=engine)
    if as_json:
        from k3deploy.planning.document import search_json

        print(json.dumps(search_json(hardware, gpus, engine, rows), indent=2))
    else:
        from k3deploy.planning.report import search_table

        _console().print(search_table(hardware, gpus, engine, rows))
