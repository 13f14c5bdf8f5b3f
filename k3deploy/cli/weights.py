"""`k3deploy weights`: the checkpoint on every node of a unit (every instance's nodes) against its manifest."""
# No `from __future__ import annotations`: typer evaluates the commands' annotations on every run.
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from k3deploy.cli.common import CatalogOpt, ExecutorOpt, FileArg, exec_overrides, with_connection_options

if TYPE_CHECKING:
    from k3deploy.launch.weights import WeightsReport

weights = typer.Typer(help="The checkpoint at model.path on every node, against the manifest (per-file size and "
                      "sha256).", no_args_is_help=True, add_completion=False)
ManifestOpt = Annotated[Path | None, typer.Option("--manifest", help="manifest file (default: validate.manifest)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the report as JSON")]


def _table(report: "WeightsReport") -> Any:
    from rich.table import Table

    t = Table(title=f"checkpoint revision {report.manifest.revision or 'unknown'}: "
              f"{len(report.manifest.files)} files, {sum(d.size for d in report.manifest.files.values()):,} bytes")
    for col in ("host", "path", "present", "verified", "wrong", "missing", "bytes to go"):
        t.add_column(col, overflow="fold")
    for n in report.nodes:
        if n.error is not None:
            t.add_row(n.host, n.path, "[red]unreachable[/]", "", "", "", n.error)
            continue
        where = f"{n.path}\n(the storage of {n.shared_with})" if n.shared_with else n.path
        t.add_row(n.host, where, str(len(n.verified) + len(n.wrong)), str(len(n.verified)),
                  str(len(n.wrong)), str(len(n.missing)), f"{n.bytes_to_go:,}")
    return t


@with_connection_options
def status(
    file: FileArg,
    manifest: ManifestOpt = None,
    executor: ExecutorOpt = None,
    as_json: JsonOpt = False,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """Per node: manifest files present, verified (sha256, hashed on every node at once; once for nodes whose
    directory is one shared filesystem), wrong, missing, and the bytes still to go; through every executor (local,
    SSH, Ray, Slurm: the nodes of a job held for the check, cancelled after it). Exit 0 when every node holds every
    file, 1 when one lacks a file or holds a wrong one, 3 when a node cannot be reached, 2 with no manifest, 4 when
    the Slurm job holding the nodes does not run within launch.ready_timeout_s."""
    from rich.console import Console

    from k3deploy.checkpoint.manifest import required_manifest
    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.weights import weights_status

    unit = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    report = weights_status(unit, required_manifest(unit.plan.topology.validate_.manifest, unit.plan.file, manifest))
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        console = Console(highlight=False, soft_wrap=True)
        console.print(_table(report))
        for n in report.nodes:
            if n.error is not None:
                console.print(f"{n.host}: cannot check the checkpoint: {n.error}")
            elif n.wrong:
                console.print(f"{n.host}: {len(n.wrong)} file(s) differ from the manifest at {n.path} "
                              f"(first: {n.wrong[0]})")
        if report.exit_code == 1:
            console.print(f"fix: k3deploy weights sync {file} --from DIR|HOST:DIR|hub")
    raise typer.Exit(report.exit_code)


@with_connection_options
def sync(
    file: FileArg,
    source: Annotated[str, typer.Option("--from", help="DIR on this machine, HOST:DIR on a node of the "
                                        "topology, or hub (the model's hub repo at model.revision: the nodes "
                                        "pull it from HF_ENDPOINT or huggingface.co; with --staging, downloaded "
                                        "here first)", show_default=False)],
    manifest: ManifestOpt = None,
    staging: Annotated[Path | None, typer.Option("--staging", help="with --from hub: download the revision into "
                                                 "this directory here (huggingface_hub), then fan out from it as "
                                                 "--from DIR does; without it the nodes pull from the hub")] = None,
    executor: ExecutorOpt = None,
    as_json: JsonOpt = False,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """Make model.path on every node (every instance's nodes) hold exactly the manifest's files: verified
    files are skipped (a rerun resumes), nodes whose directory is one shared filesystem get one copy (found by
    a mark one leaves and the others see), free space is checked first on every node, then the nodes form a
    chain, each pulling a file from the one before once it is verified there (the source's link carries each
    byte once); every file lands at a temporary name, is checked by sha256, then renamed. `--from hub`: the first
    node of the chain pulls the model's hub repo at model.revision from the hub's resolve URLs (HF_ENDPOINT, else
    huggingface.co), each byte leaving the hub once; `--from hub --staging DIR` downloads it into DIR here first
    (huggingface_hub; HF_TOKEN or `hf auth login` for gated repos), each file verified against the manifest, then
    syncs from DIR. Exit 0 done; 1 a node (or, with --staging, this machine) lacks room (before any byte moves, or
    a node's disk filled during the copy: named with its free and needed bytes), or a source file is corrupt
    (nothing of it kept); 2 invalid input, or a repo, revision or file the hub lacks; 3 a node or the hub could
    not be reached, or a node was lost (named; the others finish: rerun to complete it); 4 the Slurm job holding
    the nodes did not run within launch.ready_timeout_s; 6 --from hub --staging without huggingface_hub (the `hub`
    extra). Through every executor: local, SSH, Ray, Slurm (the nodes of a job held for the sync, cancelled after
    it)."""
    from k3deploy.cli.interrupts import sigterm_interrupts
    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.weights_unit import sync_unit

    sigterm_interrupts()  # `kill` unwinds like Ctrl-C: the nodes' servers are stopped, partial files kept
    unit = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    report, _ = sync_unit(unit, source, manifest, as_json, staging)
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    raise typer.Exit(report.exit_code)


weights.command("status")(status)
weights.command("sync")(sync)
