"""`weights sync --from hub`, both ways: pulled by the nodes from the hub's resolve URLs (the first node of the
chain; no staging), or with --staging DIR downloaded here through huggingface_hub, every file verified against the
manifest, then fanned out to the nodes; against a hub on loopback (tests/rig/fake_hub.py) that answers as the hub
does (HEAD for commit, ETag and size; GET with Range, or a redirect to its CDN; 404 with X-Error-Code).

What needs the real hub and is not tested here: authentication (HF_TOKEN, gated repos), the hub's redirects to
its CDN and its Xet storage backend (huggingface_hub picks those from the hub's headers), and rate limits."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.checkpoint.hub import HubFileRejected, fetch_revision
from k3deploy.checkpoint.manifest import FileDigest, Manifest
from k3deploy.errors import ExecError
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig.fake_hub import fake_hub
from tests.unit.test_launch_support import fake_topology

pytestmark = pytest.mark.timeout(180)
REPO = "local/kimi-k3-tiny"  # the catalog's hub_repo for the tiny model
COMMIT = "3f1c0a9d5e7b2c4a6f8e0d1b3c5a7e9f1d3b5c7a"
FILES = {"a.safetensors": b"a" * 70_000, "b.safetensors": bytes(range(256)) * 300, "sub/c.json": b"{}"}


def _hub_files(root: Path) -> Manifest:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return Manifest(revision=COMMIT, files={n: FileDigest(size=len(d), sha256=hashlib.sha256(d).hexdigest())
                                            for n, d in FILES.items()})


def _topology(tmp_path: Path, revision: str | None = COMMIT) -> Path:
    topo = fake_topology(tmp_path, "w-hub", nodes=1)
    doc = yaml.safe_load(topo.read_text())
    if revision is not None:
        doc["model"]["revision"] = revision
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    return topo


def _env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}


def _sync(tmp_path: Path, topo: Path, endpoint: str, *more: str) -> Any:
    return cli("weights", "sync", topo, "--from", "hub", "--staging", tmp_path / "staging", "--manifest",
               tmp_path / "m.json", *more, env=_env(tmp_path, endpoint))


def test_sync_from_the_hub_downloads_each_file_once_verifies_it_and_a_rerun_fetches_nothing(tmp_path: Path) -> None:
    _hub_files(tmp_path / "hub").save(tmp_path / "m.json")
    topo = _topology(tmp_path)
    with fake_hub(REPO, COMMIT, tmp_path / "hub") as hub:
        first = _sync(tmp_path, topo, hub.url, "--json")
        assert first.returncode == 0, first.stdout + first.stderr
        assert sorted(hub.gets) == sorted(FILES)
        assert json.loads(first.stdout)["nodes"][0]["sent"] == len(FILES)
        for name, data in FILES.items():
            assert (tmp_path / "ckpt" / name).read_bytes() == data
        assert cli("weights", "status", topo, "--manifest", tmp_path / "m.json").returncode == 0

        again = _sync(tmp_path, topo, hub.url)
        assert again.returncode == 0, again.stderr
        assert sorted(hub.gets) == sorted(FILES), "a rerun downloaded again what was verified"
        assert again.stderr.count("already verified in") == len(FILES), again.stderr


def test_a_hub_file_that_is_not_the_manifests_bytes_is_refused_and_reaches_no_node(tmp_path: Path) -> None:
    _hub_files(tmp_path / "hub").save(tmp_path / "m.json")
    (tmp_path / "hub" / "b.safetensors").write_bytes(b"b" * 76_800)  # the right size, other bytes
    topo = _topology(tmp_path)
    with fake_hub(REPO, COMMIT, tmp_path / "hub") as hub:
        run = _sync(tmp_path, topo, hub.url)
    assert run.returncode == 1, run.stderr
    assert "b.safetensors is not the manifest's bytes" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "staging" / "b.safetensors").exists()
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").rglob("*.safetensors"))


def test_what_the_hub_cannot_give_is_named_with_its_fix(tmp_path: Path) -> None:
    manifest = _hub_files(tmp_path / "hub")
    manifest.save(tmp_path / "m.json")
    (tmp_path / "unpinned").mkdir()
    unpinned = cli("weights", "sync", _topology(tmp_path / "unpinned", revision=None), "--from", "hub",
                   "--manifest", tmp_path / "m.json", env=_env(tmp_path, "http://127.0.0.1:9"))
    assert unpinned.returncode == 2 and "needs model.revision" in unpinned.stderr, unpinned.stderr
    topo = _topology(tmp_path)
    with fake_hub(REPO, COMMIT, tmp_path / "hub") as hub:
        other = manifest.model_copy(update={"revision": "0" * 40})
        other.save(tmp_path / "other.json")
        stale = cli("weights", "sync", topo, "--from", "hub", "--manifest", tmp_path / "other.json",
                    env=_env(tmp_path, hub.url))
        assert stale.returncode == 2 and "manifest from-hub" in stale.stderr, stale.stderr
        (tmp_path / "hub" / "sub" / "c.json").unlink()
        missing = _sync(tmp_path, topo, hub.url)
        assert missing.returncode == 2 and "lacks a file the manifest lists" in missing.stderr, missing.stderr
        pulled = cli("weights", "sync", topo, "--from", "hub", "--manifest", tmp_path / "m.json",
                     env=_env(tmp_path, hub.url))  # the node asks the hub: the same answer
        assert pulled.returncode == 2 and "lacks sub/c.json" in pulled.stderr, pulled.stderr
        assert "Traceback" not in pulled.stderr
    staged = cli("weights", "sync", topo, "--from", str(tmp_path / "hub"), "--staging", tmp_path / "staging",
                 "--manifest", tmp_path / "m.json")
    assert staged.returncode == 2 and "only with --from hub" in staged.stderr, staged.stderr


def test_sync_from_the_hub_without_staging_the_node_pulls_it_through_the_redirect_once(tmp_path: Path) -> None:
    """Nothing is downloaded here: the node follows the resolve URL's redirect to the CDN (HF_ENDPOINT's hub) and
    verifies each file; a rerun asks the hub for nothing."""
    _hub_files(tmp_path / "hub").save(tmp_path / "m.json")
    topo = _topology(tmp_path)
    with fake_hub(REPO, COMMIT, tmp_path / "hub", cdn=True) as hub:
        run = cli("weights", "sync", topo, "--from", "hub", "--manifest", tmp_path / "m.json", "--json",
                  env=_env(tmp_path, hub.url))
        assert run.returncode == 0, run.stdout + run.stderr
        assert json.loads(run.stdout)["nodes"][0]["sent"] == len(FILES) and sorted(hub.gets) == sorted(FILES)
        for name, data in FILES.items():
            assert (tmp_path / "ckpt" / name).read_bytes() == data
        assert not (tmp_path / "hf-home").exists() and not (tmp_path / "staging").exists()
        again = cli("weights", "sync", topo, "--from", "hub", "--manifest", tmp_path / "m.json",
                    env=_env(tmp_path, hub.url))
        assert again.returncode == 0 and sorted(hub.gets) == sorted(FILES), again.stderr


class _NoCalls:
    """A hub API that fails the test if called: nothing may be downloaded."""

    def model_info(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("model_info called")

    def hf_hub_download(self, *a: Any, **k: Any) -> str:
        raise AssertionError(f"downloaded {a}")


class _Silent(_NoCalls):
    """A hub that never answers, as huggingface_hub reports it after its own retries (about 23 s against a closed
    port, so not replayed here through the CLI)."""

    def hf_hub_download(self, *a: Any, **k: Any) -> str:
        from huggingface_hub.errors import LocalEntryNotFoundError

        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")


def test_a_hub_that_does_not_answer_is_a_host_error_naming_its_endpoint(tmp_path: Path) -> None:
    from huggingface_hub import constants

    manifest = _hub_files(tmp_path / "hub")
    with pytest.raises(ExecError, match="LocalEntryNotFoundError") as err:
        fetch_revision(REPO, COMMIT, manifest, tmp_path / "staging", api=_Silent())
    assert err.value.exit_code == 3 and err.value.host == constants.ENDPOINT
    assert not any(p.is_file() for p in (tmp_path / "staging").rglob("*.safetensors"))


def test_no_room_here_is_refused_before_any_byte_moves(tmp_path: Path) -> None:
    manifest = _hub_files(tmp_path / "hub")
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "a.safetensors").write_bytes(FILES["a.safetensors"])  # verified: not counted
    with pytest.raises(HubFileRejected, match=r"this machine: 1,000 bytes free at .*needs 76,802 more"):
        fetch_revision(REPO, COMMIT, manifest, tmp_path / "staging", api=_NoCalls(), free_bytes=lambda _: 1000)
