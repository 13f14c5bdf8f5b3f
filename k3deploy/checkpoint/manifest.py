"""The checkpoint manifest: every file's size and sha256, the index's weight map, the config's hash, the revision."""
from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3deploy.errors import InputError
from k3deploy.probes import shard_inventory as probe
from k3deploy.probes.shard_names import CONFIG_FILE, INDEX_FILE, MANIFEST_FILE, SINGLE_FILE
from k3deploy.probes.shard_structure import is_single_file, read_weight_map

FORMAT: Literal["k3deploy-manifest/1"] = "k3deploy-manifest/1"


class CopyState(NamedTuple):
    """One copy's files sorted against the manifest, and the bytes it still lacks (wrong and missing files)."""

    verified: tuple[str, ...]
    wrong: tuple[str, ...]  # present with a size or sha256 the manifest does not give
    missing: tuple[str, ...]
    bytes_to_go: int


class FileDigest(BaseModel):
    """Expected size and sha256 of one checkpoint file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=0, description="bytes")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex sha256 of the whole file (the hub's LFS oid)")


class Manifest(BaseModel):
    """What a pinned checkpoint revision contains; the shards stage checks every node against it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["k3deploy-manifest/1"] = Field(FORMAT, description="manifest format version")
    revision: str | None = Field(description="hub commit sha (or label) the files belong to; None if unknown")
    source: str = Field("", description="where it was made: 'dir:/path' or 'hub:owner/name'")
    files: dict[str, FileDigest] = Field(description="relative path -> size and sha256, for every file")
    config_sha256: str | None = Field(None, description="sha256 of config.json (also among files)")
    weight_map: dict[str, str] = Field(default_factory=dict, description="the index's tensor -> shard map")

    def dump(self) -> str:
        """The manifest as JSON text (sorted, stable)."""
        return self.model_dump_json(indent=1) + "\n"

    def save(self, path: Path | str) -> None:
        """Write the manifest to a file."""
        Path(path).write_text(self.dump())

    @classmethod
    def load(cls, path: Path | str) -> Manifest:
        """Read a manifest file, or a checkpoint directory's k3-manifest.json; InputError names the file."""
        file = Path(path)
        if file.is_dir():
            file = file / MANIFEST_FILE
        try:
            return cls.model_validate_json(file.read_bytes())
        except OSError as exc:
            raise InputError(f"cannot read manifest {file}: {exc.strerror or exc}") from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputError(f"{file}: not a k3deploy manifest: {where}: {first['msg']}",
                             hint="make one with `k3deploy manifest create DIR` or `manifest from-hub`") from exc

    def expected(self) -> dict[str, list[int | str]]:
        """{name: [size, sha256]}: the shape the node probe takes."""
        return {name: [d.size, d.sha256] for name, d in sorted(self.files.items())}

    def check_paths(self, where: str) -> None:
        """Refuse file paths that would leave the checkpoint directory (`where`: the manifest, as messages name
        it)."""
        for name in self.files:
            norm = posixpath.normpath(name)
            if name.startswith("/") or norm == "." or norm.startswith("../") or norm == ".." or "\\" in name:
                raise InputError(f"{where}: file {name!r} leaves the checkpoint directory",
                                 hint="a manifest lists paths relative to the checkpoint; make it again with "
                                 "`k3deploy manifest create DIR`")

    def sort_copy(self, got: dict[str, tuple[int, str]]) -> CopyState:
        """A copy's files (name -> size, sha256) sorted against the manifest."""
        verified: list[str] = []
        wrong: list[str] = []
        missing: list[str] = []
        for name, want in sorted(self.files.items()):
            have = got.get(name)
            (missing if have is None else verified if have == (want.size, want.sha256) else wrong).append(name)
        return CopyState(tuple(verified), tuple(wrong), tuple(missing),
                         sum(self.files[n].size for n in (*wrong, *missing)))


def _weight_map(text: bytes, where: str) -> dict[str, str]:
    try:
        return dict(json.loads(text)["weight_map"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{where}: no weight_map in the index ({exc})") from exc


def create_manifest(directory: Path | str, revision: str | None = None, threads: int = 0) -> Manifest:
    """Hash every file under a checkpoint directory (dot-directories and k3-manifest.json aside)."""
    root = Path(directory)
    single = is_single_file(str(root))
    if not (root / INDEX_FILE).is_file() and not single:
        raise InputError(f"{root}: no {INDEX_FILE} and no single {SINGLE_FILE}; is this a safetensors "
                         "checkpoint directory?")
    names = probe.local_files(str(root))
    digests = probe.sha256_files([str(root / n) for n in names], threads)
    missing = [n for n in names if str(root / n) not in digests]
    if missing:
        raise InputError(f"{root}: cannot read {', '.join(missing)}")
    files = {n: FileDigest(size=digests[str(root / n)][0], sha256=digests[str(root / n)][1]) for n in names}
    if revision is None:
        revision = probe.revision_hint(str(root))[0]
    return Manifest(revision=revision, source=f"dir:{root.resolve()}", files=files,
                    config_sha256=files[CONFIG_FILE].sha256 if CONFIG_FILE in files else None,
                    weight_map=_single_map(root) if single else
                    _weight_map((root / INDEX_FILE).read_bytes(), str(root / INDEX_FILE)))


def _single_map(root: Path) -> dict[str, str]:
    try:
        return read_weight_map(str(root))
    except (OSError, ValueError) as exc:
        raise InputError(f"{root / SINGLE_FILE}: unreadable safetensors header ({exc})") from exc


def verify_directory(directory: Path | str, manifest: Manifest) -> list[str]:
    """Files under a directory that are missing or differ from the manifest (empty when intact)."""
    root = Path(directory)
    digests = probe.sha256_files([str(root / n) for n in manifest.files])
    bad = []
    for name, want in sorted(manifest.files.items()):
        got = digests.get(str(root / name))
        if got is None or tuple(got) != (want.size, want.sha256):
            bad.append(name)
    return bad


def topology_manifest(given: str | None, topology_file: Path | str, override: Path | None = None) -> Manifest | None:
    """--manifest (`override`), else the topology's validate.manifest (`given`, relative to the topology file),
    else None; as validate's shards stage and `weights` read it."""
    if override is not None:
        return Manifest.load(override)
    if not given:
        return None
    path = Path(given).expanduser()
    return Manifest.load(path if path.is_absolute() else Path(topology_file).parent / path)


def required_manifest(given: str | None, topology_file: Path | str, override: Path | None = None) -> Manifest:
    """`topology_manifest`, which `weights` needs: InputError naming the fix when there is none."""
    found = topology_manifest(given, topology_file, override)
    if found is None:
        raise InputError(f"{topology_file}: no checkpoint manifest to sync or check against",
                         hint="pass --manifest FILE, or set validate.manifest (make one with `k3deploy manifest "
                         "create DIR` or `k3deploy manifest from-hub REPO --revision SHA`)")
    return found
