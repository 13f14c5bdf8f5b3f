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
        t.add_row(n.host, n.path, str(len(n.verified) + len(n.wrong)), str(len(n.verified)),
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
    """Per node: manifest files present, verified (sha256, hashed on every node at once), wrong, missing, and
    the bytes still to go. Exit 0 when every node holds every file, 1 when one lacks a file or holds a wrong
    one, 3 when a node cannot be reached, 2 with no manifest."""
    from rich.console import Console

    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.weights import load_manifest, weights_status

    prep = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    report = weights_status(prep, load_manifest(prep, manifest))
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
            console.print(f"fix: k3deploy weights sync {file} --from DIR|HOST:DIR")
    raise typer.Exit(report.exit_code)


def _hub_source(prep: Any, manifest: Any) -> Any:
    """The model's hub repo at the pinned model.revision, pulled by the first node of the chain from the hub's
    resolve URLs (HF_ENDPOINT, else huggingface.co; byte ranges resume a partial file)."""
    import os

    from k3deploy.errors import InputError
    from k3deploy.launch.weights_sync import Source

    model, rev = prep.plan.model, prep.plan.topology.model.revision
    repo = model.hub_repo if model is not None else ""
    if not repo or " " in repo:
        raise InputError(f"--from hub: model {prep.plan.topology.model.id} has no hub repo in the catalog",
                         hint="download the checkpoint to one directory first, then --from DIR or HOST:DIR")
    if not rev:
        raise InputError(f"{prep.plan.file}: --from hub needs model.revision (the commit sha to pull)",
                         hint=f"set model.revision to a commit of {repo} (the manifest's revision)")
    if manifest.revision and manifest.revision != rev:
        raise InputError(f"--from hub: model.revision {rev} is not the manifest's revision {manifest.revision}",
                         hint="make the manifest of that revision (`k3deploy manifest from-hub`) or pin its revision")
    url = f"{os.environ.get('HF_ENDPOINT', 'https://huggingface.co').rstrip('/')}/{repo}/resolve/{rev}"
    return Source(url, url=url)


def _source(spec: str, prep: Any, manifest: Any) -> Any:
    from k3deploy.errors import InputError
    from k3deploy.launch.weights_sync import Source

    host, sep, directory = spec.partition(":")
    jobs = {j.target.host: j for j in prep.jobs}
    if sep and host in jobs:
        if not directory.startswith("/"):
            raise InputError(f"--from {spec}: the directory on {host} must be an absolute path")
        return Source(directory, rank=-1, ip=jobs[host].ip), jobs[host].target
    if spec == "hub":
        return _hub_source(prep, manifest), None
    if sep and not Path(spec).is_dir():
        raise InputError(f"--from {spec}: {host} is not a node of this topology",
                         hint=f"nodes: {', '.join(jobs)}; or a directory on this machine")
    if not Path(spec).is_dir():
        raise InputError(f"--from {spec}: no such directory on this machine")
    return Source(str(Path(spec).resolve())), None


def sync_prepared(prep: Any, source: str, manifest: Path | None, quiet: bool) -> Any:
    """`weights sync` of a prepared unit (also `launch --sync-weights`): its report."""
    from k3deploy.launch.weights import checkpoint_nodes, load_manifest
    from k3deploy.launch.weights_sync import run_sync

    man = load_manifest(prep, manifest)
    src, src_target = _source(source, prep, man)
    return run_sync(prep, checkpoint_nodes(prep), man, src, src_target,
                    str(manifest or prep.plan.topology.validate_.manifest), quiet)


@with_connection_options
def sync(
    file: FileArg,
    source: Annotated[str, typer.Option("--from", help="DIR on this machine, HOST:DIR on a node of the "
                                        "topology, or hub (the model's hub repo at model.revision, pulled by the "
                                        "first node from HF_ENDPOINT or huggingface.co)", show_default=False)],
    manifest: ManifestOpt = None,
    executor: ExecutorOpt = None,
    as_json: JsonOpt = False,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """Make model.path on every node (every instance's nodes) hold exactly the manifest's files: verified
    files are skipped (a rerun resumes), free space is checked first on every node, then the nodes form a
    chain, each pulling a file from the one before once it is verified there (the source's link carries each
    byte once); every file lands at a temporary name, is checked by sha256, then renamed. Exit 0 done; 1 a
    node lacks room (before any byte moves, or its disk filled during the copy: named with its free and needed
    bytes) or a source file is corrupt (nothing of it kept); 2 invalid input; 3 a node could not be
    reached or was lost (named; the others finish: rerun to complete it)."""
    from k3deploy.cli.interrupts import sigterm_interrupts
    from k3deploy.launch.prepare import prepare

    sigterm_interrupts()  # `kill` unwinds like Ctrl-C: the nodes' servers are stopped, partial files kept
    prep = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    report = sync_prepared(prep, source, manifest, as_json)
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    raise typer.Exit(report.exit_code)


weights.command("status")(status)
weights.command("sync")(sync)
