"""A manifest from the Hugging Face hub: LFS files carry their sha256; small files are fetched and hashed."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

from k3deploy.checkpoint.manifest import CONFIG_FILE, INDEX_FILE, FileDigest, Manifest
from k3deploy.errors import ExecError, InputError


class HubApi(Protocol):
    """The two calls of huggingface_hub.HfApi this module makes (tests pass a recorded stand-in)."""

    def model_info(self, repo_id: str, *, revision: str | None = None, files_metadata: bool = False) -> Any:
        """ModelInfo with siblings[].lfs (size, sha256) when files_metadata is set."""
        ...

    def hf_hub_download(self, repo_id: str, filename: str, *, revision: str | None = None) -> str:
        """Local path of one downloaded file."""
        ...


def _default_api() -> HubApi:
    from huggingface_hub import HfApi
    api: HubApi = HfApi()
    return api


def _translated(exc: Exception, repo: str, revision: str) -> Exception:
    """Hub and network failures as K3Errors: a wrong repo or revision is input (2), no answer is a host error (3)."""
    name = type(exc).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return InputError(f"hub repo {repo}: not found or not accessible ({exc})",
                          hint="check the name; gated repos need `hf auth login` or HF_TOKEN")
    if name in ("RevisionNotFoundError", "EntryNotFoundError"):
        return InputError(f"hub repo {repo} has no revision {revision} ({exc})", hint="pass a commit sha of the repo")
    return ExecError(f"{name}: {exc}", host="huggingface.co", hint="check the network, proxy and HF_ENDPOINT")


def _call(where: tuple[str, str], fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # every library or network failure becomes one K3Error here
        if type(exc).__module__.split(".")[0] not in ("huggingface_hub", "requests", "httpx", "urllib3"):
            raise
        raise _translated(exc, *where) from exc


def manifest_from_hub(repo: str, revision: str, api: HubApi | None = None) -> Manifest:
    """Every file of `repo` at `revision`: LFS files from the hub's sha256, others downloaded and hashed."""
    hub = api if api is not None else _default_api()
    info = _call((repo, revision), hub.model_info, repo, revision=revision, files_metadata=True)
    files: dict[str, FileDigest] = {}
    small: dict[str, bytes] = {}
    for sibling in info.siblings or ():
        lfs = sibling.lfs
        if lfs is not None:
            files[sibling.rfilename] = FileDigest(size=int(lfs["size"]), sha256=str(lfs["sha256"]))
            continue
        local = _call((repo, revision), hub.hf_hub_download, repo, sibling.rfilename, revision=info.sha or revision)
        data = Path(local).read_bytes()
        small[sibling.rfilename] = data
        files[sibling.rfilename] = FileDigest(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    if INDEX_FILE not in small:
        raise InputError(f"hub repo {repo}@{revision} has no {INDEX_FILE}: not a sharded safetensors checkpoint")
    try:
        weight_map = dict(json.loads(small[INDEX_FILE])["weight_map"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"hub repo {repo}@{revision}: {INDEX_FILE} has no weight_map ({exc})") from exc
    return Manifest(revision=info.sha or revision, source=f"hub:{repo}", files=files,
                    config_sha256=files[CONFIG_FILE].sha256 if CONFIG_FILE in files else None,
                    weight_map=weight_map)
