"""`k3deploy weights`: each node's copy of the checkpoint against the manifest, on local nodes."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
import yaml

from k3deploy.checkpoint.manifest import FileDigest, Manifest
from k3deploy.errors import ExecError, InputError
from k3deploy.executors.base import CommandResult, ProcessHandle
from k3deploy.executors.factory import ExecutorFactory
from k3deploy.executors.fleet import NodeFleet
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.target import ExecTarget, LocalTarget, SlurmTarget
from k3deploy.launch.allocation import allocation_for
from k3deploy.launch.prepare import prepare
from k3deploy.launch.weights import weights_status
from k3deploy.launch.weights_sync import HubFailed, Source, SyncError, sync
from k3deploy.launch.weights_unit import node_or_local_source, serving_node
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.probes import weights_node
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
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
    """A local executor that records the checkpoint files it puts, and can be made to lose its node (its sync
    process killed, the connection gone) once that node has verified a file."""

    puts: ClassVar[list[str]] = []
    lost: ClassVar[set[str]] = set()  # log file endings (-RANK.log) of the nodes to lose

    def put(self, local_path: str, remote_path: str) -> None:
        if not remote_path.endswith(".plan.json"):
            self.puts.append(remote_path)
        super().put(local_path, remote_path)

    def follow(self, handle: ProcessHandle, tail_lines: int = 10, stop: threading.Event | None = None
               ) -> Iterator[str]:
        for line in super().follow(handle, tail_lines, stop):
            yield line
            if line.startswith('{"type": "file"') and handle.log_path.endswith(tuple(self.lost)):
                self.terminate(handle, 1.0)
                raise ExecError("connection lost", host=self.host)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[NodeFleet, dict[int, tuple[str, str]], Manifest, Path]]:
    src = tmp_path / "src"
    manifest = small_checkpoint(src)
    Recording.puts, Recording.lost = [], set()
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
    assert sorted(Recording.puts) == sorted(f"{weights_node.put_name(targets[0][1], n)}.up" for n in manifest.files)
    assert [n.sent for n in report.nodes.values()] == [3, 3, 3]
    assert list((src.parent / "logs").glob("k3weights-*")) == []  # a node that completed keeps no log, no plan
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
    assert not any(list(Path(p).glob(".*k3part")) for _, p in targets.values() if Path(p).is_dir())


def test_a_node_lost_mid_sync_is_named_and_the_nodes_after_it_finish(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    Recording.lost = {"-1.log"}
    report = sync(fleet, targets, manifest, Source(str(src)), log_dir=str(src.parent / "logs"))
    assert report.exit_code == 3 and "connection lost" in (report.nodes[1].error or "")
    kept = sorted(p.name for p in (src.parent / "logs").glob("k3weights-*.log"))
    assert [Path(report.nodes[1].log).name] == kept and report.nodes[0].log == report.nodes[2].log == ""
    assert final_files(targets[2][1]) == {n: d.sha256 for n, d in manifest.files.items()}


def test_sync_refuses_before_copying_paths_outside_and_nodes_without_room(nodes: Any) -> None:
    fleet, targets, manifest, src = nodes
    escape = manifest.model_copy(update={"files": {**manifest.files, "../x": manifest.files["sub/c.json"]}})
    with pytest.raises(InputError, match=r"'\.\./x' leaves the checkpoint directory"):
        escape.check_paths("the manifest")
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
    assert "(or pin the allocation's nodes, launch.slurm.nodelist)" in str(refused.value.hint)


def test_a_launch_after_a_sync_is_kept_to_the_nodes_the_sync_held(tmp_path: Path) -> None:
    prep = prepare(fake_topology(tmp_path, "w-kept", nodes=2), None, ExecOverrides())
    assert allocation_for(prep.jobs).kept_to(prep.plan, prep.jobs) is prep.plan  # static hosts: the same ones
    placed = tuple(j.model_copy(update={"target": SlurmTarget(host=f"n{5 - j.rank}", job_id=7)}) for j in prep.jobs)
    slurm = allocation_for(placed)
    assert slurm.kept_to(prep.plan, placed).topology.launch.slurm.nodelist == ["n5", "n4"]
    t = prep.plan.topology
    pinned = prep.plan._replace(topology=t.model_copy(update={"launch": t.launch.model_copy(update={
        "slurm": t.launch.slurm.model_copy(update={"nodelist": ["n9"]})})}))
    assert slurm.kept_to(pinned, placed) is pinned  # a topology that names its nodes asks for those already


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


def test_a_node_drops_what_it_passed_on_once_the_node_before_finds_it_corrupt(tmp_path: Path) -> None:
    """A node passes a file on while it arrives, all but its last byte until it has verified it: a file the
    node before finds not the manifest's never completes downstream, and what arrived there of it is dropped."""
    import http.server
    import subprocess
    import sys

    size = 300_000
    b_part = Path(weights_node.temp_name(str(tmp_path / "b"), "w.bin"))

    class Source(http.server.BaseHTTPRequestHandler):
        """All but the last byte of wrong bytes; the last one once node b holds the rest (passed on by a)."""

        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.write(b"x" * (size - 1))
            wait_for(lambda: b_part.exists() and b_part.stat().st_size == size - 1, 30)
            self.wfile.write(b"x")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Source)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    plan = {"files": [{"name": "w.bin", "size": size, "sha256": hashlib.sha256(b"y" * size).hexdigest()}]}
    procs: list[subprocess.Popen[str]] = []

    def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith('{"type": "file"'):
                return cast(dict[str, Any], json.loads(line))
        raise AssertionError("no result line")

    try:
        feeder = f"http://127.0.0.1:{server.server_address[1]}"
        for node in ("a", "b"):
            (tmp_path / f"{node}.plan").write_text(json.dumps({**plan, "feeders": [feeder]}))
            spec = {"op": "chain", "ip": "127.0.0.1", "path": str(tmp_path / node), "plan": str(tmp_path / f"{node}.plan")}
            proc = subprocess.Popen([sys.executable, weights_node.__file__, json.dumps(spec)], stdout=subprocess.PIPE,
                                    text=True)
            procs.append(proc)
            assert proc.stdout is not None
            feeder = f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}"
        first, second = result(procs[0]), result(procs[1])
        assert first["corrupt"] and first["source"] and not first.get("upstream"), first
        assert second["corrupt"] and second.get("upstream"), second
        assert [list((tmp_path / node).iterdir()) for node in ("a", "b")] == [[], []]
    finally:
        server.shutdown()
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
