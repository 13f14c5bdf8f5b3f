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
    from k3deploy.planning.pd_prediction import RolePrediction
    from k3deploy.planning.prediction import Prediction
    from k3deploy.planning.ranking import RankedShape
    from k3deploy.planning.workload import Workload


def plan(
    files: Annotated[list[Path] | None, typer.Argument(help="topology YAML files", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (schema in README)")] = False,
    check: Annotated[bool, typer.Option("--check", help="CI mode: one line per file + GitHub annotations")] = False,
    search: Annotated[bool, typer.Option("--search", help="list every legal shape for --hardware x --gpus; with a "
                                         "FILE that has roles and --workload, rank its prefill/decode layouts")
                      ] = False,
    hardware: Annotated[str | None, typer.Option(help="accelerator id (with --search)")] = None,
    gpus: Annotated[int | None, typer.Option(help="number of accelerators (with --search)")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="accelerators per node (with --search)")] = None,
    engine: Annotated[str | None, typer.Option(help="sglang | vllm | vllm-ascend (with --search; default: "
                                               "vllm-ascend on Ascend NPUs, else sglang)")] = None,
    model: Annotated[str | None, typer.Option(help="model id (with --search; default: the first catalog model the "
                                              "engine can serve on --hardware)")] = None,
    workload: Annotated[str | None, typer.Option(
        help="predict TTFT, TPOT and throughput for in=TOKENS,out=TOKENS,concurrency=N[,effort=E][,prompts=N]; "
        "with --search, rank the shapes by it")] = None,
    objective: Annotated[str, typer.Option(help="throughput | latency (with --search --workload)")] = "throughput",
    tpot_max: Annotated[float | None, typer.Option(help="TPOT limit in ms (with --search --workload)")] = None,
    speculation: Annotated[bool, typer.Option(
        "--speculation", help="also rank each shape with DSpark drafting, at every draft length the catalog has "
        "an acceptance length for (with --search --workload)")] = False,
    html: Annotated[Path | None, typer.Option(
        "--html", help="also write a self-contained HTML report here: the budget drawn, the prediction with its "
        "band; with --search --workload, the Pareto front (needs the 'report' extra)")] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Check legality and the per-GPU memory budget of topology files. Exit 0 feasible, 1 infeasible, 2 invalid."""
    from k3deploy.planning.files import catalog_for, plan_path

    cat = catalog_for(catalog)
    load = _workload(workload, search, objective, tpot_max)
    if speculation and (not search or load is None):
        raise InputError("--speculation ranks shapes with and without drafting: it needs --search and --workload",
                         hint="e.g. --search --hardware b300 --gpus 8 --workload in=8192,out=1024,concurrency=16 "
                         "--speculation")
    if html is not None:
        from k3deploy.extras import require

        if search and load is None:
            raise InputError("--html with --search draws the Pareto front of a prediction: it needs --workload",
                             hint="e.g. --search --hardware b300 --gpus 8 --workload in=8192,out=1024,concurrency=16 "
                             "--html search.html")
        require("report", what="--html")
    if search and files:
        _layouts(cat, files, (hardware, gpus, gpus_per_node, engine, model), as_json, load, objective, tpot_max,
                 speculation, html)
        return
    if search:
        if load is not None:
            _ranked(cat, hardware, gpus, gpus_per_node, engine, model, as_json, load, objective, tpot_max,
                    speculation, html)
        else:
            _search(cat, hardware, gpus, gpus_per_node, engine, model, as_json)
        return
    if not files:
        raise InputError("no topology files given", hint="k3deploy plan topologies/*.yaml, or --search")
    results = [plan_path(f, cat) for f in files]
    predictions = _predictions(results, cat, load)
    if html is not None:
        from k3deploy.html_report.page import write_page
        from k3deploy.html_report.plan_page import plan_page

        write_page(html, plan_page(results, predictions, load is not None))
    if as_json:
        from k3deploy.planning.document import invalid_json, plan_json

        docs = [plan_json(r.plan) if r.plan and not r.load_issues else invalid_json(r.file, list(r.issues))
                for r in results]
        if load is not None:
            from k3deploy.planning.pd_prediction import prediction_document

            for doc, p in zip(docs, predictions):
                doc["prediction"] = prediction_document(p) if p is not None else None
        print(json.dumps(docs if len(docs) > 1 else docs[0], indent=2))
    elif check:
        _check_lines(results)
    else:
        _show(results, predictions, load is not None)
    codes = {r.exit_code for r in results}
    raise typer.Exit(2 if 2 in codes else 1 if 1 in codes else 0)


def _console() -> "Console":
    """Plain-text-safe console: file names and messages are never read as rich markup or :emoji: codes."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, markup=False, emoji=False)


def _workload(text: "str | None", search: bool, objective: str, tpot_max: "float | None") -> "Workload | None":
    from k3deploy.planning.workload import parse_workload

    if text is None:
        if objective != "throughput" or tpot_max is not None:
            raise InputError("--objective and --tpot-max rank shapes by a prediction: they need --workload",
                             hint="e.g. --search --hardware b300 --gpus 8 --workload in=8192,out=1024,concurrency=16")
        return None
    if tpot_max is not None and not tpot_max > 0:
        raise InputError(f"--tpot-max {tpot_max:g}: expected milliseconds > 0")
    if not search and (objective != "throughput" or tpot_max is not None):
        raise InputError("--objective and --tpot-max rank the shapes of --search", hint="add --search")
    return parse_workload(text)


def _predictions(results: "list[FileResult]", cat: "Catalog", load: "Workload | None"
                 ) -> "list[Prediction | RolePrediction | None]":
    """One prediction per feasible plan (None for the others), per role where it has roles; a catalog that cannot
    time one is exit 2."""
    if load is None:
        return [None] * len(results)
    from k3deploy.planning.pd_prediction import predict_unit
    from k3deploy.planning.perf_model import PerfUnknown
    from k3deploy.records.calibration import load_calibration
    from k3deploy.records.files import state_dir_of

    out: list[Prediction | RolePrediction | None] = []
    for r in results:
        if r.plan is None or r.load_issues or not r.plan.feasible:
            out.append(None)
            continue
        t = r.plan.topology
        try:
            # A deployment of this name that `calibrate` fitted: its own factors apply.
            cal = load_calibration(state_dir_of(t), t.name)
            out.append(predict_unit(r.plan, cat, load, cal))
        except PerfUnknown as exc:
            raise InputError(f"{r.file}: cannot predict --workload: {exc}") from None
    return out


def _show(results: "list[FileResult]", predictions: "list[Prediction | RolePrediction | None]", asked: bool) -> None:
    from rich.text import Text

    from k3deploy.plan_report.report import issue_lines, plan_renderable

    console = _console()
    for r, p in zip(results, predictions):
        if r.plan is None or r.load_issues:
            console.print(Text.assemble(f"{r.file}: ", ("INVALID", "bold red")))
            console.print(issue_lines(r.file, r.issues))
        else:
            console.print(plan_renderable(r.plan))
            if p is not None:
                from k3deploy.plan_report.perf_report import prediction_renderable

                console.print(prediction_renderable(p))
            elif asked:
                console.print(Text("no prediction for --workload: the plan is not feasible", style="yellow"))
        console.print()


def _check_lines(results: "list[FileResult]") -> None:
    for r in results:
        errors = [i for i in r.issues if i.severity == "error"]
        warnings = [i for i in r.issues if i.severity == "warning"]
        waiting = [i for i in r.issues if i.code == "NOT_CHECKED"]
        status = {0: "ok", 1: "infeasible", 2: "invalid"}[r.exit_code]
        detail = f"{len(errors)} error(s), {len(warnings)} warning(s)" + (
            f", {len(waiting)} group(s) of checks waiting for a fix" if waiting else "")
        if r.plan is not None and r.plan.shape is not None and r.exit_code == 0:
            s = r.plan.shape
            detail = f"TP{s.tp}/EP{s.ep}/DP{s.dp}/PP{s.pp} on {s.nnodes}x{s.gpus_per_node}; " + detail
        print(f"{status:<10} {r.file}: {detail}")
        for i in errors + warnings + waiting:
            level = {"error": "error", "warning": "warning"}.get(i.severity, "notice")
            loc = f"file={r.file}" + (f",line={i.line},col={i.column or 1}" if i.line else "")
            text = i.render(r.file).replace("%", "%25").replace("\n", "%0A")
            print(f"::{level} {loc},title={i.code}::{text}")


def _search(cat: "Catalog", hardware: str | None, gpus: int | None, per_node: int | None,
            engine_opt: str | None, model_opt: str | None, as_json: bool) -> None:
    from k3deploy.engines.kinds import FLAVOURS, engine_family
    from k3deploy.planning.search import default_pairing, search_shapes

    if hardware is None or gpus is None:
        raise InputError("--search needs --hardware and --gpus", hint="e.g. --search --hardware h100-80gb --gpus 32")
    engine, model = default_pairing(cat, hardware, engine_opt, model_opt)
    if engine not in FLAVOURS:
        raise InputError(f"--engine {engine}: expected {', '.join(FLAVOURS)}")
    rows = search_shapes(cat, model_id=model, hardware_id=hardware, gpus=gpus,
                         family=engine_family(engine), gpus_per_node=per_node, engine_id=engine)
    if as_json:
        from k3deploy.planning.document import search_json

        print(json.dumps(search_json(hardware, gpus, engine, rows, model), indent=2))
    else:
        from k3deploy.plan_report.report import search_table

        _console().print(search_table(hardware, gpus, engine, rows, model))


def _ranked(cat: "Catalog", hardware: "str | None", gpus: "int | None", per_node: "int | None",
            engine_opt: "str | None", model_opt: "str | None", as_json: bool, load: "Workload", objective: str,
            tpot_max: "float | None", speculation: bool, html: "Path | None") -> None:
    from k3deploy.engines.kinds import FLAVOURS, engine_family
    from k3deploy.planning.ranking import rank_shapes, why_top
    from k3deploy.planning.search import default_pairing

    if hardware is None or gpus is None:
        raise InputError("--search needs --hardware and --gpus", hint="e.g. --search --hardware b300 --gpus 8")
    engine, model = default_pairing(cat, hardware, engine_opt, model_opt)
    if engine not in FLAVOURS:
        raise InputError(f"--engine {engine}: expected {', '.join(FLAVOURS)}")
    def rank_at(concurrency: int) -> "list[RankedShape]":
        """The search ranked for the workload, or for it at another concurrency (--html's Pareto sweep)."""
        w = load if concurrency == load.concurrency else load._replace(concurrency=concurrency, num_prompts=None)
        assert hardware is not None and gpus is not None
        return rank_shapes(cat, model_id=model, hardware_id=hardware, gpus=gpus, family=engine_family(engine),
                           engine_id=engine, workload=w, objective=objective,  # type: ignore[arg-type]
                           tpot_max_ms=tpot_max, gpus_per_node=per_node, speculation=speculation)

    rows = rank_at(load.concurrency)
    why = why_top(rows, objective)  # type: ignore[arg-type]
    if html is not None:
        from k3deploy.html_report.page import write_page
        from k3deploy.html_report.search_page import search_page

        write_page(html, search_page(hardware, gpus, engine, model, load, objective, tpot_max, rows, why, rank_at))
    if as_json:
        print(json.dumps({"hardware": hardware, "gpus": gpus, "engine": engine, "model": model,
                          "workload": load.model_dump(),
                          "objective": objective, "tpot_max_ms": tpot_max, "speculation": speculation, "why": why,
                          "shapes": [r.model_dump() for r in rows]}, indent=2))
    else:
        from k3deploy.plan_report.ranking_report import ranked_table

        _console().print(ranked_table(hardware, gpus, engine, load, objective, rows, why))


def _layouts(cat: "Catalog", files: "list[Path]", pool: "tuple[str | None, int | None, int | None, str | None, str | None]",
             as_json: bool, load: "Workload | None", objective: str, tpot_max: "float | None", speculation: bool,
             html: "Path | None") -> None:
    """`plan FILE --search --workload`: the prefill/decode layouts of one topology with roles, ranked."""
    from k3deploy.planning.ranking import objective_of
    from k3deploy.planning.role_search import rank_layouts, search_layouts, why_top_layout
    from k3deploy.topology.loader import load_topology
    from k3deploy.topology.pd import ROLE_NAMES, role_group

    hint = "e.g. k3deploy plan topologies/pd-h200-1p1d-sglang.yaml --search --workload in=8192,out=1024,concurrency=8"
    if len(files) != 1 or load is None:
        raise InputError("--search with a topology FILE ranks that one file's prefill/decode layouts by a "
                         "prediction: it needs exactly one FILE and --workload", hint=hint)
    if any(x is not None for x in pool) or speculation:
        raise InputError("--hardware, --gpus, --gpus-per-node, --engine, --model and --speculation shape a search "
                         "without a FILE: the FILE's roles give its pool", hint=hint)
    goal = objective_of(objective)
    loaded = load_topology(files[0])
    t = loaded.topology
    if t.roles is None:
        raise InputError(f"{files[0]}: --search with a FILE ranks the layouts of a topology with `roles`; this one "
                         "is one deployment", hint="search its pool with --search --hardware H --gpus N --workload ...")
    rows = rank_layouts(search_layouts(loaded, cat, load, tpot_max), goal)
    why = why_top_layout(rows, goal)
    gpus = {r: len(role_group(t, r).nodes) * t.hardware.gpus_per_node for r in ROLE_NAMES}
    if html is not None:
        from k3deploy.html_report.page import write_page
        from k3deploy.html_report.search_page import layouts_page

        write_page(html, layouts_page(str(files[0]), gpus, t.hardware.gpu, load, objective, tpot_max, rows, why))
    if as_json:
        print(json.dumps({"file": str(files[0]), "hardware": t.hardware.gpu, "engine": t.engine.kind,
                          "model": t.model.id, "gpus": gpus, "workload": load.model_dump(), "objective": objective,
                          "tpot_max_ms": tpot_max, "why": why, "layouts": [r.model_dump() for r in rows]}, indent=2))
    else:
        from k3deploy.plan_report.ranking_report import layouts_table

        _console().print(layouts_table(str(files[0]), gpus, load, objective, rows, why))
