"""Checkpoint manifests: from a directory, from the hub (huggingface_hub parsing a hub-shaped answer), the CLI."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from k3deploy.checkpoint.hub import manifest_from_hub
from k3deploy.checkpoint.manifest import Manifest, create_manifest, verify_directory
from k3deploy.errors import ExecError, InputError
from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / "tests" / "assets" / "hub"


class RecordedHub:
    """Answers model_info from the hub-shaped fixture (parsed by huggingface_hub's own ModelInfo) and serves
    downloads from a local checkpoint directory; records every call."""

    def __init__(self, files: Path, fail: Exception | None = None) -> None:
        self.files, self.fail = files, fail
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def model_info(self, repo_id: str, *, revision: str | None = None, files_metadata: bool = False) -> Any:
        from huggingface_hub.hf_api import ModelInfo

        self.calls.append(("model_info", repo_id, {"revision": revision, "files_metadata": files_metadata}))
        if self.fail is not None:
            raise self.fail
        return ModelInfo(**json.loads((HUB / "model_info.json").read_text()))

    def hf_hub_download(self, repo_id: str, filename: str, *, revision: str | None = None) -> str:
        self.calls.append(("download", filename, {"revision": revision}))
        local = self.files / filename
        return str(local if local.exists() else HUB / filename)


def test_create_records_every_file_the_weight_map_and_config_hash(checkpoint: Path) -> None:
    made = create_manifest(checkpoint, revision="abc123")
    names = {p.name for p in checkpoint.iterdir()} - {"k3-manifest.json"}
    assert set(made.files) == names
    for name in names:
        data = (checkpoint / name).read_bytes()
        assert (made.files[name].size, made.files[name].sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert made.config_sha256 == made.files["config.json"].sha256
    assert made.weight_map == json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    assert made.revision == "abc123"
    assert create_manifest(checkpoint).revision == "tiny-r1"  # default: the k3-manifest.json the writer left


def test_manifest_round_trips_and_verifies(checkpoint: Path, tmp_path: Path) -> None:
    made = create_manifest(checkpoint, revision="r")
    made.save(tmp_path / "m.json")
    assert Manifest.load(tmp_path / "m.json") == made
    assert verify_directory(checkpoint, made) == []
    (tmp_path / "bad.json").write_text('{"revision": "r", "files": {"a": {"size": -1, "sha256": "x"}}}')
    with pytest.raises(InputError, match=r"bad.json: not a k3deploy manifest: files.a.size"):
        Manifest.load(tmp_path / "bad.json")


def test_from_hub_uses_lfs_sha256_and_hashes_small_files(checkpoint: Path) -> None:
    hub = RecordedHub(checkpoint)
    made = manifest_from_hub("local/kimi-k3-tiny", "main", api=hub)
    info = json.loads((HUB / "model_info.json").read_text())
    assert made.revision == info["sha"]  # the branch resolved to the commit the hub answered with
    assert made.source == "hub:local/kimi-k3-tiny"
    local = create_manifest(checkpoint)
    shared = set(made.files) - {"README.md"}
    assert shared == set(local.files)
    assert {n: made.files[n] for n in shared} == local.files  # same digests whichever way they were made
    assert made.weight_map == local.weight_map and made.config_sha256 == local.config_sha256
    assert hub.calls[0] == ("model_info", "local/kimi-k3-tiny", {"revision": "main", "files_metadata": True})
    downloads = {c[1]: c[2]["revision"] for c in hub.calls[1:]}
    assert downloads == {name: info["sha"] for name in ("README.md", "config.json", "model.safetensors.index.json",
                                                        "tokenizer.json", "tokenizer_config.json")}  # LFS shards never


def test_from_hub_failures_are_k3_errors(checkpoint: Path) -> None:
    from huggingface_hub.errors import RepositoryNotFoundError

    fake_response = type("R", (), {"headers": {}, "status_code": 404, "request": None, "url": "u"})()
    missing = RepositoryNotFoundError("404 Client Error: Repository Not Found", response=fake_response)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="hub repo nobody/none: not found"):
        manifest_from_hub("nobody/none", "main", api=RecordedHub(checkpoint, fail=missing))
    with pytest.raises(ExecError, match="huggingface.co"):
        manifest_from_hub("a/b", "main", api=RecordedHub(checkpoint, fail=_network_error()))


def _network_error() -> Exception:
    import httpx

    return httpx.ConnectError("[Errno 101] Network is unreachable")


def test_cli_create_writes_file_and_rejects_a_non_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    done = run_k3deploy("manifest", "create", checkpoint, "--revision", "f00", "-o", tmp_path / "m.json", timeout_s=60)
    assert done.returncode == 0, done.stderr
    assert Manifest.load(tmp_path / "m.json").revision == "f00"
    assert "revision f00" in done.stderr
    bad = run_k3deploy("manifest", "create", tmp_path, timeout_s=60)
    assert bad.returncode == 2 and "no model.safetensors.index.json" in bad.stderr
