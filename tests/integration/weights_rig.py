"""What the `weights` tests through Ray and Slurm share: a small checkpoint on h01's own disk (the source, `--from
h01:DIR`), every host's own disk at model.path (bind mounts in the hosts' mount namespaces, which their raylets and
slurmds share, so every command run through them does), and the round the issue asks of each executor: status
shows every file missing, sync copies node to node, status then shows every node verified."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3deploy.checkpoint.manifest import FileDigest, Manifest
from tests.k3deploy_cli import run_k3deploy
from tests.rig import HostRig, disks

FILES = {f"model-{i:05d}.safetensors": 300_000 for i in range(1, 4)} | {"config.json": 200}


@dataclass(frozen=True)
class WeightsDisks:
    at: str  # model.path: each host's own disk there
    src: str  # the checkpoint on h01's own disk
    manifest: Path
    tmp: Path

    def finals(self, i: int) -> dict[str, str]:
        """Files host i holds at their final names (not the dot-named temporary ones), and their sha256."""
        root = self.tmp / f"disk{i}"
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
                if p.is_file() and not p.name.startswith(".")}


@contextlib.contextmanager
def own_disks(rig: HostRig, tmp: Path, files: Mapping[str, bytes] | None = None) -> Iterator[WeightsDisks]:
    """Each host's own empty disk at `tmp/ckpt`, the checkpoint (`files`, else FILES of random bytes) on h01's at
    `tmp/src`; unmounted on the way out (the rig outlives the test)."""
    d = WeightsDisks(at=str(tmp / "ckpt"), src=str(tmp / "src"), manifest=tmp / "m.json", tmp=tmp)
    data = dict(files) if files is not None else {name: os.urandom(size) for name, size in FILES.items()}
    mounted: list[tuple[str, str]] = []
    try:
        for i, h in enumerate(rig.hosts):
            disks.own_disk(rig, h.name, d.at, tmp / f"disk{i}")
            mounted.append((h.name, d.at))
        disks.own_disk(rig, rig.hosts[0].name, d.src, tmp / "srcdisk")
        mounted.append((rig.hosts[0].name, d.src))
        for name, blob in data.items():
            (tmp / "srcdisk" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "srcdisk" / name).write_bytes(blob)
        Manifest(revision="r1", files={n: FileDigest(size=len(b), sha256=hashlib.sha256(b).hexdigest())
                                       for n, b in data.items()}).save(d.manifest)
        yield d
    finally:
        for host, at in mounted:
            rig.exec(host, ["umount", at])


@contextlib.contextmanager
def slowed(rig: HostRig, rate_bytes_s: int) -> Iterator[Callable[[], None]]:
    """Every host's private link capped at `rate_bytes_s` each way (a sync slow enough to act during it) until
    the function it gives is called, or on the way out."""
    capped: list[str] = []

    def lift() -> None:
        while capped:
            disks.unlimit(rig, capped.pop())
    try:
        for h in rig.hosts:
            disks.limit(rig, h.name, rate_bytes_s)
            capped.append(h.name)
        yield lift
    finally:
        lift()


def weights(env: Mapping[str, str], *args: object) -> tuple[int, dict[str, Any], str]:
    """`k3deploy weights ... --json`: exit code, report, stderr."""
    run = run_k3deploy("weights", *args, "--json", timeout_s=120, env=env)
    return run.returncode, json.loads(run.stdout) if run.stdout.strip() else {}, run.stderr


def status_sync_status(d: WeightsDisks, topo: Path, hosts: list[str], env: Mapping[str, str]) -> None:
    """Status: every file missing on every node (exit 1); sync from `hosts[0]:src`: each node pulls each file once
    (exit 0) onto its own disk; status: every node verified (exit 0)."""
    rc, before, err = weights(env, "status", topo, "--manifest", d.manifest)
    assert rc == 1, err
    assert [(n["host"], n["verified"], len(n["missing"])) for n in before["nodes"]] == \
        [(h, 0, len(FILES)) for h in hosts], before

    rc, synced, err = weights(env, "sync", topo, "--from", f"{hosts[0]}:{d.src}", "--manifest", d.manifest)
    assert rc == 0, err
    assert [(n["host"], n["sent"], n["error"]) for n in synced["nodes"]] == \
        [(h, len(FILES), None) for h in hosts], synced
    want = {n: f.sha256 for n, f in Manifest.load(d.manifest).files.items()}
    assert [d.finals(i) for i in range(len(hosts))] == [want] * len(hosts)
    assert os.listdir(d.at) == []  # written on the hosts' own disks, not on the file system they share

    rc, after, err = weights(env, "status", topo, "--manifest", d.manifest)
    assert rc == 0, err
    assert [(n["verified"], n["complete"]) for n in after["nodes"]] == [(len(FILES), True)] * len(hosts), after


def copies(rig: HostRig, i: int) -> list[str]:
    """The PIDs of host i's sync process (it serves the host's checkpoint and pulls what the host lacks)."""
    ps = rig.exec(rig.hosts[i], ["ps", "-ww", "-eo", "pid=,args="]).stdout.splitlines()
    return [line.split()[0] for line in ps if '"op": "chain"' in line]


def mid_sync(rig: HostRig, d: WeightsDisks, i: int) -> bool:
    """Host i has verified some of the checkpoint but not all, its sync process still running, and host i+1,
    which pulls from it, has a file begun (the moment to lose host i)."""
    held = len(d.finals(i))
    begun = any(p.is_file() for p in (d.tmp / f"disk{i + 1}").rglob("*"))
    return 0 < held < len(Manifest.load(d.manifest).files) and begun and bool(copies(rig, i))
