"""`k3deploy calibrate`: fit a cluster's own decode and prefill factors from its effort measurements."""
# No `from __future__ import annotations`: typer evaluates the command's annotations on every run.
import json
from typing import Annotated, Any

import typer

from k3deploy.cli.common import CatalogOpt
from k3deploy.cli.status import StateDirOpt
from k3deploy.errors import InputError

NAMES = {"mean_ttft_ms": ("TTFT", "ms"), "mean_tpot_ms": ("TPOT", "ms"), "output_throughput": ("output", "tok/s")}


def calibrate(
    deployment: Annotated[str, typer.Argument(help="deployment name or its topology file", show_default=False)],
    show: Annotated[bool, typer.Option("--show", help="print the stored calibration, fit nothing")] = False,
    remove: Annotated[bool, typer.Option("--remove", help="forget the calibration: plan predicts from the "
                                         "catalog again")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (contract in README)")] = False,
    state_dir: StateDirOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """Fit this cluster's decode and prefill factors to the deployment's `validate --only effort` runs, store
    them with its records (`plan --workload` on a topology of that name applies them), and show each run's
    error before and after. Exit 0 fitted, 2 invalid input, 5 no deployment or no effort measurements."""
    from k3deploy.validate import calibration as lib

    where = str(state_dir) if state_dir else None
    if show and remove:
        raise InputError("--show and --remove: pick one")
    if remove:
        name, directory = lib.where(deployment, where)
        from k3deploy.records.calibration import remove_calibration

        gone = remove_calibration(directory, name)
        msg = f"{name}: calibration removed" if gone else f"{name}: no calibration to remove"
        print(json.dumps({"deployment": name, "removed": gone}) if as_json else msg)
        return
    if show:
        doc = lib.show(*lib.where(deployment, where))
    else:
        doc = lib.calibrate_target(deployment, where, catalog or [])
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc)


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cal, fit = doc["calibration"], doc["fit"]
    table = Table(title=f"{doc['deployment']}: each effort run, predicted before and after calibration",
                  title_justify="left", caption="run: concurrency, prompt / answer tokens; * a fitted figure",
                  caption_justify="left")
    for col in ("run", "figure", "measured", "before", "error", "after", "error "):
        table.add_column(col, justify="left" if col in ("run", "figure") else "right")
    for run in doc["runs"]:
        w = run["workload"]
        label = f"c{w['concurrency']} {w['input_tokens']:,} / {w['output_tokens']:,}"
        for key, (figure, unit) in NAMES.items():
            if key not in run["before"]:
                continue
            b, a = run["before"][key], run["after"][key]
            fitted = "*" if figure.lower() in run["fitted"] else ""
            table.add_row(label, figure + fitted, f"{run['measured'][key]:,.1f} {unit}", f"{b['predicted']:,.1f}",
                          f"{b['error']:+.0%}", f"{a['predicted']:,.1f}", f"{a['error']:+.0%}")
            label = ""
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    console.print(f"decode factor x{cal['decode_factor']:.4g}, prefill factor x{cal['prefill_factor']:.4g} "
                  f"({fit['note']}); largest error of the fitted figures {fit['error_before']:.0%} before, "
                  f"{fit['error_after']:.0%} after")
    console.print(f"band: {doc['band']}")
    if "file" in doc:
        console.print(f"stored in {doc['file']}: `k3deploy plan` of a topology named {doc['deployment']} "
                      f"applies it to --workload (remove with `k3deploy calibrate {doc['deployment']} --remove`)")
