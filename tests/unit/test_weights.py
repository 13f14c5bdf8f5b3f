"""`k3deploy weights`: each node's copy of the checkpoint against the manifest, on local nodes."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
import yaml

from k3deploy.checkpoint.manifest import FileDigest, Manifest
from k3deploy.errors import ExecError, InputError
from k3deploy.executors.base import CommandResult
from k3deploy.executors.factory import ExecutorFactory
from k3deploy.executors.fleet import NodeFleet
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.target import ExecTarget, LocalTarget, SlurmTarget
from k3deploy.launch.prepare import prepare
from k3deploy.launch.weights import weights_status
from k3deploy.launch.weights_sync import HubFailed, Source, SyncError, sync
from k3deploy.launch.weights_unit import node_or_local_source, serving_node
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.probes import weights_node
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig.fake_hub import fake_hub
from tests.unit.test_launch_support import fake_topology

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    return fake_topology(tmp_path, "w-status", nodes=2)


def test_status_sorts_each_file_and_counts_the_bytes_to_go(tmp_path: Path, topo: Path,
                                                          checkpoint_manifest: tuple[Path, Manifest]) -> None:
    src, manifest = checkpoint_manifest
    manifest.save(tmp_path / "m.json")
    empty = cli("weights", "status", topo, "--manifest", tmp_path / "m.json", "--json")
    assert empty.returncode == 1, empty.stderr
    node = json.loads(empty.stdout)["nodes"][0]
    total = sum(d.size for d in manifest.files.values())
    assert (node["host"], node["ranks"], node["verified"], node["bytes_to_go"]) == ("localhost", ["0", "1"], 0, total)
    assert sorted(node["missing"]) == sorted(manifest.files)

    shutil.copytree(src, tmp_path / "ckpt")
    shard = min(n for n in manifest.files if n.endswith(".safetensors"))
    with open(tmp_path / "ckpt" / shard, "r+b") as f:  # one flipped byte: present, not verified
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    (tmp_path / "ckpt" / "tokenizer.json").unlink()
    table = cli("weights", "status", topo, "--manifest", tmp_path / "m.json")
    assert table.returncode == 1 and "fix: k3deploy weights sync" in table.stdout, table.stdout
    node = json.loads(cli("weights", "status", topo, "--manifest", tmp_path / "m.json", "--json").stdout)["nodes"][0]
    assert (node["wrong"], node["missing"]) == ([shard], ["tokenizer.json"])
    assert node["verified"] == len(manifest.files) - 2
    assert node["bytes_to_go"] == manifest.files[shard].size + manifest.files["tokenizer.json"].size

    shutil.copy(src / shard, tmp_path / "ckpt" / shard)
    shutil.copy(src / "tokenizer.json", tmp_path / "ckpt" / "tokenizer.json")
    done = cli("weights", "status", topo, "--manifest", tmp_path / "m.json", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["bytes_to_go"] == 0, done.stdout


def test_status_without_a_manifest_names_the_fix_and_reads_validate_manifest(
        tmp_path: Path, topo: Path, checkpoint_manifest: tuple[Path, Manifest]) -> None:
    none = cli("weights", "status", topo)
    assert none.returncode == 2 and "--manifest FILE" in none.stderr and "Traceback" not in none.stderr, none.stderr
    doc = yaml.safe_load(topo.read_text())
    doc["validate"] = {"manifest": "m.json"}  # relative to the topology file
    checkpoint_manifest[1].save(tmp_path / "m.json")
    shutil.copytree(checkpoint_manifest[0], tmp_path / "ckpt")
    topo.write_text(yaml.safe_dump(doc))
    ok = cli("weights", "status", topo, "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr


class Unreachable:
    """An executor whose host cannot be reached."""

    def __init__(self, target: ExecTarget) -> None:
        self.host = target.host

    def run(self, *_: object, **__: object) -> CommandResult:
        raise ExecError("ssh: connection refused", host=self.host)

    def close(self) -> None:
        pass


def test_status_of_an_unreachable_node_is_exit_3_naming_it(topo: Path,
                                                           checkpoint_manifest: tuple[Path, Manifest]) -> None:
    prep = prepare(topo, None, ExecOverrides())
    report = weights_status(prep, checkpoint_manifest[1], cast(ExecutorFactory, Unreachable))
    assert report.exit_code == 3
    assert [(n.host, n.error) for n in report.nodes] == [("localhost", "localhost: ssh: connection refused")]


def small_checkpoint(root: Path) -> Manifest:
    """Three small files (one in a subdirectory) and their manifest."""
    files = {"a.safetensors": b"a" * 70_000, "b.safetensors": bytes(range(256)) * 300, "sub/c.json": b"{}"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return Manifest(revision="r1", files={n: FileDigest(size=len(d), sha256=hashlib.sha256(d).hexdigest())
                                          for n, d in files.items()})


class Recording(LocalExecutor):
    """A local executor that records what it puts and whence each node pulls, and can be made to lose its node on a
    copy, or to have a node's first pull from another node's server refused (that server lost)."""

    puts: ClassVar[list[str]] = []
    lost: ClassVar[set[str]] = set()
    refused: ClassVar[set[str]] = set()
    pulls: ClassVar[list[tuple[str, str]]] = []  # (the puller's path, the URL)

    def put(self, local_path: str, remote_path: str) -> None:
        self.puts.append(remote_path)
        super().put(local_path, remote_path)

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0, **kw: Any) -> CommandResult:
        if any(f'"op": "fetch", "path": "{p}"' in " ".join(command) for p in self.lost):
            raise ExecError("connection lost", host=self.host)
        spec = json.loads(command[-1]) if not isinstance(command, str) and '"op": "fetch"' in command[-1] else {}
        if spec.get("url"):
            self.pulls.append((spec["path"], spec["url"]))
            if spec["path"] in self.refused:
                self.refused.discard(spec["path"])
                answer = {"type": "result", "ok": False, "error": f"{spec['url']}: Connection refused"}
                return CommandResult(exit_code=0, stdout=json.dumps(answer) + "\n", stderr="")
        return super().run(command, timeout_s, **kw)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[NodeFleet, dict[int, tuple[str, str]], Manifest, Path]]:
    src = tmp_path / "src"
    manifest = small_checkpoint(src)
    Recording.puts, Recording.lost, Recording.refused, Recording.pulls = [], set(), set(), []
    targets = {i: ("127.0.0.1", str(tmp_path / f"n{i}" / "ckpt")) for i in range(3)}
    with NodeFleet({i: LocalTarget(host="localhost") for i in targets},
                   cast(ExecutorFactory, lambda t: Recording(t.host))) as fleet:
        yield fleet, targets, manifest, src


def final_files(path: str) -> dict[str, str]:
    root = Path(path)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")} if root.is_dir() else {}


def test_sync_fans_out_node_to_node_and_a_rerun_skips_verified_files(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    report = sync(fleet, targets, manifest, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert report.exit_code == 0, report.as_json()
    want = {n: d.sha256 for n, d in manifest.files.items()}
    assert all(final_files(p) == want for _, p in targets.values())
    # Only the chain's first node got the files from this machine; the others pulled them from a node.
    assert sorted(Recording.puts) == sorted(weights_node.temp_name(targets[0][1], n) for n in manifest.files)
    assert [n.sent for n in report.nodes.values()] == [3, 3, 3]
    Path(targets[1][1], "a.safetensors").unlink()
    Recording.puts.clear()
    again = sync(fleet, targets, manifest, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert [(n.skipped, n.sent) for n in again.nodes.values()] == [(3, 0), (2, 1), (3, 0)]
    assert Recording.puts == [] and final_files(targets[1][1]) == want  # node 1 pulled it from node 0


def test_a_flipped_source_byte_is_refused_at_the_first_node_and_kept_nowhere(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    data = bytearray((src / "b.safetensors").read_bytes())
    data[7] ^= 1
    (src / "b.safetensors").write_bytes(bytes(data))
    with pytest.raises(SyncError, match=r"source file .*b\.safetensors is corrupt, refused at localhost"):
        sync(fleet, targets, manifest, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert all("b.safetensors" not in final_files(p) for _, p in targets.values())
    assert not list(Path(targets[0][1]).glob(".*k3part"))


def test_a_node_lost_mid_sync_is_named_and_the_nodes_after_it_finish(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    Recording.lost = {targets[1][1]}
    report = sync(fleet, targets, manifest, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert report.exit_code == 3 and "connection lost" in (report.nodes[1].error or "")
    assert final_files(targets[2][1]) == {n: d.sha256 for n, d in manifest.files.items()}


def test_a_node_whose_server_fails_a_pull_is_passed_over_and_the_puller_finishes(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    Recording.refused = {targets[2][1]}  # node 2's first pull, from node 1 (the node before it), is refused
    report = sync(fleet, targets, manifest, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert report.exit_code == 0 and [n.error for n in report.nodes.values()] == [None] * 3, report.as_json()
    assert final_files(targets[2][1]) == {n: d.sha256 for n, d in manifest.files.items()}
    at = {path: [urllib.parse.urlsplit(url).netloc for p, url in Recording.pulls if p == path]
          for _, path in targets.values()}
    (node0,) = set(at[targets[1][1]])  # node 1 pulls every file from node 0's server
    by_node2 = at[targets[2][1]]
    # Refused by node 1, then every file from node 0: node 1 is not asked again.
    assert by_node2[0] != node0 and by_node2[1:] == [node0] * len(manifest.files), by_node2


def test_sync_refuses_before_copying_paths_outside_and_nodes_without_room(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    escape = manifest.model_copy(update={"files": {**manifest.files, "../x": manifest.files["sub/c.json"]}})
    with pytest.raises(InputError, match=r"'\.\./x' leaves the checkpoint directory"):
        sync(fleet, targets, escape, Source(str(src)), log_dir=str(src.parent / "logs"))
    huge = manifest.model_copy(update={"files": {**manifest.files, "a.safetensors": FileDigest(
        size=1 << 60, sha256=manifest.files["a.safetensors"].sha256)}})
    with pytest.raises(SyncError, match=r"localhost: [\d,]+ bytes free at .*, the checkpoint needs [\d,]+ more"):
        sync(fleet, targets, huge, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert all(final_files(p) == {} for _, p in targets.values()) and Recording.puts == []


def test_cli_sync_from_a_node_directory_then_status_is_complete(tmp_path: Path) -> None:
    src = tmp_path / "src"
    small_checkpoint(src).save(tmp_path / "m.json")
    topo = fake_topology(tmp_path, "w-sync", nodes=1)
    run = cli("weights", "sync", topo, "--from", f"localhost:{src}", "--manifest", tmp_path / "m.json", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["nodes"][0]["sent"] == 3
    assert cli("weights", "status", topo, "--manifest", tmp_path / "m.json").returncode == 0


def test_a_source_node_is_taken_as_its_allocation_holds_it_and_one_it_does_not_hold_is_refused(
        tmp_path: Path) -> None:
    prep = prepare(fake_topology(tmp_path, "w-held", nodes=2), None, ExecOverrides())
    src, host = node_or_local_source("localhost:/models/k3", prep)
    assert (src.directory, src.rank, host) == ("/models/k3", -1, "localhost")
    placed = tuple(j.model_copy(update={"ip": f"10.9.0.{j.rank + 1}", "target": SlurmTarget(host=f"n{j.rank}",
                                                                                               job_id=7)})
                   for j in prep.jobs)  # as a Slurm job placed them: its nodes' names and addresses
    src, target = serving_node(dataclasses.replace(src, directory="/d"), "n1", placed)
    assert (src.ip, target) == ("10.9.0.2", SlurmTarget(host="n1", job_id=7))
    with pytest.raises(InputError, match="localhost is not among the nodes held for the sync") as refused:
        serving_node(src, "localhost", placed)
    assert "held: n0, n1" in str(refused.value.hint)


def test_launch_sync_weights_refuses_a_corrupt_source_and_starts_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    small_checkpoint(src).save(tmp_path / "m.json")
    (src / "sub" / "c.json").write_bytes(b"[]")  # not the manifest's bytes
    topo = fake_topology(tmp_path, "w-launch", nodes=1)
    doc = yaml.safe_load(topo.read_text())
    doc["validate"] = {"manifest": "m.json"}
    topo.write_text(yaml.safe_dump(doc))
    run = cli("launch", topo, "--sync-weights", str(src), "--skip-preflight")
    assert run.returncode == 1 and "c.json is corrupt, refused at localhost" in run.stderr, run.stderr
    assert not (tmp_path / "state" / "w-launch.json").exists()


def test_a_node_server_left_idle_exits_by_itself(tmp_path: Path) -> None:
    """A sync killed outright (SIGKILL) cannot stop the servers it started on the nodes: each ends once idle."""
    import subprocess
    import sys

    spec = json.dumps({"op": "serve", "path": str(tmp_path), "ip": "127.0.0.1", "idle_s": 0.5})
    proc = subprocess.Popen([sys.executable, weights_node.__file__, spec], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith('{"type": "serving"')
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_sync_from_the_hub_pulls_each_file_once_through_its_redirect(nodes: Any, tmp_path: Path) -> None:
    """`--from hub` without staging: the first node pulls the revision's resolve URLs (following the redirect to
    the CDN, as huggingface.co answers), the others pull from the node before; each file leaves the hub once. Needs
    the real hub (not tested here): huggingface.co reachable from the first node, its CDN's answer to a Range
    request, and a gated repo's token (not forwarded to the nodes)."""
    fleet, targets, manifest, src = nodes
    shutil.copytree(src, tmp_path / "hub")
    with fake_hub("org/model", "r1", tmp_path / "hub", cdn=True) as hub:
        url = f"{hub.url}/org/model/resolve/r1"
        report = sync(fleet, targets, manifest, Source(url, url=url), log_dir=str(src.parent / "logs"))
        assert report.exit_code == 0, report.as_json()
        assert sorted(hub.gets) == sorted(manifest.files) and Recording.puts == []
        want = {n: d.sha256 for n, d in manifest.files.items()}
        assert all(final_files(p) == want for _, p in targets.values())
        (tmp_path / "hub" / "sub" / "c.json").write_bytes(b"[]")  # not the manifest's: refused at the first node
        shutil.rmtree(targets[0][1])
        with pytest.raises(SyncError, match=rf"source file {url}/sub/c.json is corrupt, refused at localhost"):
            sync(fleet, targets, manifest, Source(url, url=url), log_dir=str(src.parent / "logs"))
        (tmp_path / "hub" / "sub" / "c.json").unlink()
        with pytest.raises(InputError, match=r"lacks sub/c.json, or withholds it .*HTTP 404 EntryNotFound") as lacks:
            sync(fleet, targets, manifest, Source(url, url=url), log_dir=str(src.parent / "logs"))
        assert lacks.value.exit_code == 2 and "sub/c.json" not in final_files(targets[0][1])


def test_a_hub_that_does_not_answer_the_first_node_stops_the_sync_naming_the_hub(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    url = "http://127.0.0.1:9/org/model/resolve/r1"  # the discard port: nothing listens
    with pytest.raises(HubFailed, match=r"^http://127.0.0.1:9: the hub did not give a.safetensors to localhost") as err:
        sync(fleet, targets, manifest, Source(url, url=url), log_dir=str(src.parent / "logs"))
    assert err.value.exit_code == 3 and all(final_files(p) == {} for _, p in targets.values())
