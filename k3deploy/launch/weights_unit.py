"""`weights sync` of a prepared unit, as `k3deploy weights sync` and `launch --sync-weights` call it: the manifest
(`--manifest` or validate.manifest), where the files come from (a directory here, `HOST:DIR` on a node, or the
hub at model.revision: pulled by the nodes, or downloaded here first into a staging directory), and the sync to
every instance's nodes."""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from k3deploy.checkpoint.manifest import Manifest
from k3deploy.errors import InputError
from k3deploy.executors.target import ExecTarget
from k3deploy.launch.prepare import Prepared, held_unit
from k3deploy.launch.weights import checkpoint_nodes, load_manifest
from k3deploy.launch.weights_sync import Source, SyncReport, check_paths, run_sync
from k3deploy.nodeplan.jobs import NodeJob

HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub's default endpoint, when HF_ENDPOINT is not set


def node_or_local_source(spec: str, prep: Prepared) -> tuple[Source, str | None]:
    """`--from DIR` (this machine) or `--from HOST:DIR` (a node of the unit, which serves it): the source and the
    host of the node that serves it (None: this machine), checked against the topology before any node is held."""
    host, sep, directory = spec.partition(":")
    hosts = [j.target.host for j in prep.jobs]
    if sep and host in hosts:
        if not directory.startswith("/"):
            raise InputError(f"--from {spec}: the directory on {host} must be an absolute path")
        return Source(directory, rank=-1), host
    if sep and not Path(spec).is_dir():
        raise InputError(f"--from {spec}: {host} is not a node of this topology",
                         hint=f"nodes: {', '.join(dict.fromkeys(hosts))}; or a directory on this machine")
    if not Path(spec).is_dir():
        raise InputError(f"--from {spec}: no such directory on this machine")
    return Source(str(Path(spec).resolve())), None


def serving_node(src: Source, host: str, jobs: Sequence[NodeJob]) -> tuple[Source, ExecTarget]:
    """The source node of `--from HOST:DIR` as its allocation holds it: the source with the private IP its server
    listens on, and the target that reaches it."""
    job = next((j for j in jobs if j.target.host == host), None)
    if job is None:
        raise InputError(f"--from {host}:{src.directory}: {host} is not among the nodes held for the sync",
                         hint=f"held: {', '.join(dict.fromkeys(j.target.host for j in jobs))}; name one of them "
                         "(or pin the allocation's nodes, launch.slurm.nodelist)")
    return dataclasses.replace(src, ip=job.ip), job.target


def pinned_revision(prep: Prepared, manifest: Manifest) -> tuple[str, str]:
    """`--from hub`'s repo and revision: the catalog's hub repo of the model at model.revision (required: a hub
    sync is pinned), which must be the manifest's revision when it names one."""
    t, model = prep.plan.topology, prep.plan.model
    assert model is not None  # a feasible plan knows its model
    make = f"`k3deploy manifest from-hub {model.hub_repo} --revision SHA` makes a manifest for it"
    if not t.model.revision:
        raise InputError(f"{prep.plan.file}: --from hub needs model.revision, the commit sha to pull",
                         hint=f"set model.revision: SHA (the manifest's revision; {make})")
    if manifest.revision and manifest.revision != t.model.revision:
        raise InputError(f"--from hub: the manifest is for revision {manifest.revision}, model.revision is "
                         f"{t.model.revision}", hint=f"make the manifest for the pinned revision ({make}) or pin "
                         "the manifest's revision")
    return model.hub_repo, t.model.revision


def hub_source(prep: Prepared, manifest: Manifest) -> Source:
    """`--from hub` without staging: the revision's resolve URLs on the hub (HF_ENDPOINT, else huggingface.co),
    which the first node of the chain pulls (following the hub's redirect to its CDN; a partial file resumed by
    Range), so each byte leaves the hub once; no token goes to the nodes."""
    repo, revision = pinned_revision(prep, manifest)
    url = (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/") + f"/{repo}/resolve/{revision}"
    return Source(url, url=url)


def hub_directory(prep: Prepared, manifest: Manifest, staging: Path, quiet: bool) -> str:
    """`--from hub --staging DIR`: the pinned revision downloaded into `staging` here (huggingface_hub), every file
    verified against the manifest; the directory it is in."""
    from k3deploy.checkpoint.hub import fetch_revision
    from k3deploy.extras import require

    repo, revision = pinned_revision(prep, manifest)
    require("hub", what="weights sync --from hub --staging DIR")
    if quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    def said(name: str, size: int, downloaded: bool) -> None:
        if not quiet:
            print(f"hub: {name} ({size:,} bytes) {'downloaded and verified' if downloaded else 'already verified'}"
                  f" in {staging}", file=sys.stderr)

    return str(fetch_revision(repo, revision, manifest, staging, on_file=said).resolve())


def sync_unit(prep: Prepared, source: str, manifest: Path | None, quiet: bool,
              staging: Path | None = None) -> SyncReport:
    """The manifest's files onto every node of the unit from `source` (DIR, HOST:DIR or hub; hub with `staging`:
    downloaded there first): its report."""
    man = load_manifest(prep, manifest)
    where = str(manifest or prep.plan.topology.validate_.manifest)
    if staging is not None and source != "hub":
        raise InputError(f"--staging {staging}: only with --from hub (where the hub download goes here)",
                         hint=f"drop --staging: --from {source} is already a checkpoint directory")
    host = None
    if source == "hub":
        check_paths(man, where)
        src = hub_source(prep, man) if staging is None else Source(hub_directory(prep, man, staging, quiet))
    else:
        src, host = node_or_local_source(source, prep)
    with held_unit(prep) as jobs:
        src, target = serving_node(src, host, jobs) if host is not None else (src, None)
        return run_sync(prep, checkpoint_nodes(prep, jobs), man, src, target, where, quiet)


def on_synced_nodes(prep: Prepared, report: SyncReport) -> Prepared:
    """`launch --sync-weights` on Slurm: the sync held a job of its own, so the launch's job asks for exactly the
    nodes that job had and the sync filled (sbatch --nodelist); the scheduler could otherwise place it on nodes
    without the weights. A topology that pins its nodes (launch.slurm.nodelist) already asks for those; replicas
    behind a router each hold a job of their own and are left to the scheduler."""
    t = prep.plan.topology
    if prep.service is not None or t.launch.slurm.nodelist or not prep.jobs or prep.jobs[0].target.kind != "slurm":
        return prep
    hosts = list(dict.fromkeys(n.host for _, n in sorted(report.nodes.items())))
    slurm = t.launch.slurm.model_copy(update={"nodelist": hosts})
    topology = t.model_copy(update={"launch": t.launch.model_copy(update={"slurm": slurm})})
    return dataclasses.replace(prep, plan=prep.plan._replace(topology=topology))
