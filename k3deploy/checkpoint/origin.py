"""Where a sync's files come from, worked out once with its manifest before any node is held: the manifest
(`--manifest`, else the topology's validate.manifest), its paths checked, and for the hub the pinned revision:
its resolve URLs (the nodes pull them), or its files downloaded here first into a staging directory."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from k3deploy.checkpoint.hub import fetch_revision
from k3deploy.checkpoint.manifest import Manifest, required_manifest
from k3deploy.errors import InputError

HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub's default endpoint, when HF_ENDPOINT is not set


@dataclass(frozen=True)
class HubPin:
    """`--from hub`: the catalog's hub repo of the model at model.revision, and where it is downloaded here first
    (`--staging`; None: the nodes pull it)."""

    repo: str
    revision: str
    staging: Path | None = None


@dataclass(frozen=True)
class Origin:
    """A sync's manifest (`where`: its file, as messages name it) and, from the hub, where its files are: a
    directory here (staged) or the revision's resolve URL (None for a directory the caller names)."""

    manifest: Manifest
    where: str
    directory: str | None = None
    url: str | None = None


def sync_origin(given: str | None, topology_file: Path | str, override: Path | None, hub: HubPin | None,
                quiet: bool) -> Origin:
    """The manifest, its paths checked, and the hub revision's files when `hub` is given (the manifest's revision
    must be the pinned one): without staging, the resolve URLs on the hub (HF_ENDPOINT, else huggingface.co), which
    the first node pulls (each byte leaves the hub once; no token goes to the nodes); with staging, every file
    downloaded there and verified against the manifest."""
    manifest = required_manifest(given, topology_file, override)
    where = str(override or given)
    manifest.check_paths(where)
    if hub is None:
        return Origin(manifest, where)
    if manifest.revision and manifest.revision != hub.revision:
        raise InputError(f"--from hub: the manifest is for revision {manifest.revision}, model.revision is "
                         f"{hub.revision}", hint=f"make the manifest for the pinned revision ({make_hint(hub.repo)})"
                         " or pin the manifest's revision")
    if hub.staging is None:
        url = (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/") + f"/{hub.repo}/resolve/{hub.revision}"
        return Origin(manifest, where, url=url)
    return Origin(manifest, where, directory=str(_staged(hub, hub.staging, manifest, quiet).resolve()))


def make_hint(repo: str) -> str:
    """How a manifest for a hub repo's pinned revision is made."""
    return f"`k3deploy manifest from-hub {repo} --revision SHA` makes a manifest for it"


def _staged(hub: HubPin, staging: Path, manifest: Manifest, quiet: bool) -> Path:
    if quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    def said(name: str, size: int, downloaded: bool) -> None:
        if not quiet:
            print(f"hub: {name} ({size:,} bytes) {'downloaded and verified' if downloaded else 'already verified'}"
                  f" in {staging}", file=sys.stderr)

    return fetch_revision(hub.repo, hub.revision, manifest, staging, on_file=said)
