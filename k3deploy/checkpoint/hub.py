"""The Hugging Face hub as a checkpoint's origin: a manifest from it (LFS files carry their sha256; small files are
fetched and hashed), and a pinned revision's files downloaded to a directory here, each verified against the
manifest before anything is sent on (`weights sync --from hub --staging DIR`)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from k3deploy.checkpoint.manifest import CONFIG_FILE, INDEX_FILE, FileDigest, Manifest, verify_directory
from k3deploy.errors import ExecError, InputError, K3Error


class HubApi(Protocol):
    """The two calls of huggingface_hub.HfApi this module makes (tests pass a recorded stand-in)."""

    def model_info(self, repo_id: str, *, revision: str | None = None, files_metadata: bool = False) -> Any:
        """ModelInfo with siblings[].lfs (size, sha256) when files_metadata is set."""
        ...

    def hf_hub_download(self, repo_id: str, filename: str, *, revision: str | None = None,
                        local_dir: str | None = None) -> str:
        """Local path of one downloaded file (under `local_dir` when given)."""
        ...


def _default_api() -> HubApi:
    from huggingface_hub import HfApi
    api: HubApi = HfApi()
    return api


def _endpoint() -> str:
    """The hub this process talks to (huggingface_hub reads HF_ENDPOINT once, at import)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def _translated(exc: Exception, repo: str, revision: str) -> Exception:
    """Hub and network failures as K3Errors: a wrong repo, revision or file is input (2), no answer is a host error
    (3, naming the hub it asked)."""
    name = type(exc).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return InputError(f"hub repo {repo}: not found or not accessible ({exc})",
                          hint="check the name; gated repos need `hf auth login` or HF_TOKEN")
    if name == "RevisionNotFoundError":
        return InputError(f"hub repo {repo} has no revision {revision} ({exc})", hint="pass a commit sha of the repo")
    if name in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return InputError(f"hub repo {repo}@{revision} lacks a file the manifest lists ({exc})",
                          hint=f"make the manifest from that revision: k3deploy manifest from-hub {repo} "
                          f"--revision {revision}")
    return ExecError(f"{name}: {exc}", host=_endpoint(), hint="check the network, proxy and HF_ENDPOINT "
                     "(HF_HUB_OFFLINE=1 forbids any download)")


@contextlib.contextmanager
def _hub_errors(repo: str, revision: str) -> Iterator[None]:
    """Every hub library or network failure inside, as one K3Error (`_translated`); anything else as it is."""
    try:
        yield
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("huggingface_hub", "requests", "httpx", "urllib3"):
            raise
        raise _translated(exc, repo, revision) from exc


def manifest_from_hub(repo: str, revision: str, api: HubApi | None = None) -> Manifest:
    """Every file of `repo` at `revision`: LFS files from the hub's sha256, others downloaded and hashed."""
    hub = api if api is not None else _default_api()
    files: dict[str, FileDigest] = {}
    small: dict[str, bytes] = {}
    with _hub_errors(repo, revision):
        info = hub.model_info(repo, revision=revision, files_metadata=True)
        for sibling in info.siblings or ():
            lfs = sibling.lfs
            if lfs is not None:
                files[sibling.rfilename] = FileDigest(size=int(lfs["size"]), sha256=str(lfs["sha256"]))
                continue
            data = Path(hub.hf_hub_download(repo, sibling.rfilename, revision=info.sha or revision)).read_bytes()
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


class HubFileRejected(K3Error):
    """A hub download that must not go on: a file that is not the manifest's bytes, or no room here (exit 1)."""

    exit_code = 1


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def fetch_revision(repo: str, revision: str, manifest: Manifest, directory: Path, *, api: HubApi | None = None,
                   free_bytes: Callable[[Path], int] = _free_bytes,
                   on_file: Callable[[str, int, bool], None] | None = None) -> Path:
    """Every manifest file of `repo` at `revision` into `directory` (on this machine), each checked by sha256
    against the manifest (`verify_directory`): files already verified there are skipped (a rerun resumes), the room
    for the rest is checked before any byte moves, and a downloaded file that is not the manifest's bytes is removed
    and refused (HubFileRejected), so nothing of it reaches a node. `on_file(name, size, downloaded)` after each
    file. The directory."""
    if manifest.revision and manifest.revision != revision:
        raise InputError(f"the manifest is for revision {manifest.revision}, model.revision is {revision}",
                         hint=f"make the manifest for the pinned revision: k3deploy manifest from-hub {repo} "
                         f"--revision {revision} -o FILE")
    directory.mkdir(parents=True, exist_ok=True)
    with _hub_errors(repo, revision):
        todo = verify_directory(directory, manifest)
        need = sum(manifest.files[n].size for n in todo)
        room = free_bytes(directory)
        if room < need:
            raise HubFileRejected(f"this machine: {room:,} bytes free at {directory}, the hub download needs "
                                  f"{need:,} more; nothing was downloaded",
                                  hint=f"free {need - room:,} bytes, or pass --staging DIR on a larger disk, or let "
                                  "the nodes pull from the hub (--from hub without --staging)")
        hub = api if api is not None else _default_api()
        for name in sorted(set(manifest.files) - set(todo)):
            if on_file is not None:
                on_file(name, manifest.files[name].size, False)
        for name in todo:
            want = manifest.files[name]
            local = Path(hub.hf_hub_download(repo, name, revision=revision, local_dir=str(directory)))
            if verify_directory(directory, manifest.model_copy(update={"files": {name: want}})):
                local.unlink(missing_ok=True)
                raise HubFileRejected(f"hub repo {repo}@{revision}: {name} is not the manifest's bytes (size "
                                      f"{want.size:,}, sha256 {want.sha256[:12]}...): removed, sent to no node",
                                      hint=f"check that the manifest is for this revision (k3deploy manifest "
                                      f"from-hub {repo} --revision {revision}); rerun to download it again")
            if on_file is not None:
                on_file(name, want.size, True)
    return directory
