"""`k3deploy weights sync` over SSH on the namespace rig, each host with its OWN disk at the checkpoint path (a
bind mount of a private directory, or a small tmpfs, in the host's mount namespace: tests/rig/disks.py), the
source a directory on h01's own disk (`--from HOST:DIR`), every byte over the hosts' private links (HTTP range
requests, node to node). A sync killed half way and rerun sends only what is missing (the hosts' receive
counters prove it); a disk filled mid-copy stops that node naming its free and needed bytes, with no file at
its final name that fails its checksum, while the others finish; a flipped source byte is refused at the first
node and reaches no other; a node without room is refused before any byte moves."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from k3deploy.checkpoint.manifest import FileDigest, Manifest
from tests.integration.conftest import named_rig
from tests.integration.sim_deployments import Deployments, hosts_empty
from tests.k3deploy_cli import run_k3deploy as cli
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
from tests.rig import PRIV_IFACE, HostRig, disks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FILES = 8
SIZE = 1_000_000
RATE = 2_000_000  # bytes/s each way on every private link, where a test slows the copy down to act during it


@pytest.fixture(scope="module")
def wrig() -> Iterator[HostRig]:
    yield from named_rig("kwts", 4)


@dataclass
class Setup:
    rig: HostRig
    tmp: Path
    at: str  # model.path, each host's own disk
    topo: Path
    manifest: Path
    man: Manifest
    source: str  # --from HOST:DIR (h01's own disk)
    src_disk: Path

    def disk(self, i: int) -> Path:
        """Host i's disk as this machine sees it (bind-mounted at `at` in that host only)."""
        return self.tmp / f"disk{i}"

    def sync(self, *extra: str) -> tuple[int, dict[str, object], str]:
        run = cli("weights", "sync", self.topo, "--from", self.source, "--manifest", self.manifest, "--json",
                  *extra, timeout_s=180)
        return run.returncode, json.loads(run.stdout) if run.stdout.strip() else {}, run.stderr

    def complete_sync(self) -> tuple[list[dict[str, Any]], list[int]]:
        """A sync that must complete: each node's line of its report, and the bytes each host's private link
        received meanwhile."""
        rx0 = self.rx()
        rc, report, err = self.sync()
        rx = [b - a for a, b in zip(rx0, self.rx())]
        assert rc == 0, err
        nodes = report["nodes"]
        assert isinstance(nodes, list)
        return nodes, rx

    def rx(self) -> list[int]:
        return [self.rig.iface_bytes(h, PRIV_IFACE)[0] for h in self.rig.hosts]


def finals(root: Path) -> dict[str, str]:
    """Files at their final names (not the dot-named temporary ones) and their sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


def on_host(s: Setup, i: int) -> dict[str, str]:
    """Every file at `at` on host i, seen from inside it (its tmpfs is invisible here): name -> sha256. A file the
    sync removes between `find` listing it and `sha256sum` reading it (a part file renamed, the shared-storage probe's
    marker) is left out; any other error fails."""
    run = s.rig.exec(s.rig.hosts[i].name, ["sh", "-c", f"cd {s.at} && find . -type f -exec sha256sum {{}} +"])
    gone = ": No such file or directory"
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 0 or (lines and all(line.endswith(gone) for line in lines)), run.stderr
    return {line.split(None, 1)[1].strip()[2:]: line.split()[0] for line in run.stdout.splitlines()}


@pytest.fixture
def setup(wrig: HostRig, tmp_path: Path) -> Iterator[Setup]:
    at = str(tmp_path / "ckpt")
    src = str(tmp_path / "src")
    disks.own_disk(wrig, "h01", src, tmp_path / "srcdisk")
    files = {f"model-{i:05d}.safetensors": os.urandom(SIZE) for i in range(1, FILES + 1)}
    for name, data in files.items():
        (tmp_path / "srcdisk" / name).write_bytes(data)
    man = Manifest(revision="r1", files={n: FileDigest(size=len(d), sha256=hashlib.sha256(d).hexdigest())
                                         for n, d in files.items()})
    man.save(tmp_path / "m.json")
    topo = Deployments(wrig, Path(at), tmp_path).topology(f"w-{tmp_path.name[-12:]}")
    s = Setup(wrig, tmp_path, at, topo, tmp_path / "m.json", man, f"{wrig.hosts[0].mgmt_ip}:{src}",
              tmp_path / "srcdisk")
    yield s
    for h in wrig.hosts:
        if wrig.exec(h.name, ["tc", "qdisc", "show", "dev", PRIV_IFACE]).stdout.startswith("qdisc tbf"):
            disks.unlimit(wrig, h.name)
    assert hosts_empty(wrig, 15.0), {h.name: wrig.pids(h) for h in wrig.hosts}


def stop(proc: subprocess.Popen[str], sig: int | None, timeout_s: float = 120) -> tuple[str, str]:
    """Signal the sync (None: let it end) and wait for it; one that does not end dumps its threads' stacks."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"the sync did not end {timeout_s:g} s after signal {sig}:\n{err[-8000:]}") from None


def start_sync(s: Setup) -> subprocess.Popen[str]:
    return start_k3deploy("weights", "sync", s.topo, "--from", s.source, "--manifest", s.manifest, "--json",
                          env={"PYTHONFAULTHANDLER": "1"})


def own_disks(s: Setup) -> None:
    for i, h in enumerate(s.rig.hosts):
        disks.own_disk(s.rig, h.name, s.at, s.disk(i))


def test_a_sync_killed_half_way_then_rerun_sends_only_the_missing_files(setup: Setup) -> None:
    s = setup
    own_disks(s)
    for h in s.rig.hosts:
        disks.limit(s.rig, h.name, RATE)
    want = {n: d.sha256 for n, d in s.man.files.items()}
    proc = start_sync(s)
    try:
        assert wait_for(lambda: len(finals(s.disk(1))) >= 2, 120), [finals(s.disk(i)) for i in range(4)]
    finally:
        _, err = stop(proc, signal.SIGTERM)  # as `kill` or Ctrl-C: the sync unwinds, stopping its servers
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert hosts_empty(s.rig, 15.0), "the killed sync left processes on the hosts"
    before = [finals(s.disk(i)) for i in range(4)]
    for held in before:  # never a wrong file at a final name
        assert all(want[n] == sha for n, sha in held.items()), held
    assert any(len(held) < FILES for held in before), "the sync finished before it was killed: nothing to prove"
    assert os.listdir(s.at) == [], "the hosts wrote to the shared file system, not to their own disks"

    nodes, rx = s.complete_sync()
    for i, node in enumerate(nodes):
        assert node["host"] == s.rig.hosts[i].mgmt_ip
        assert (node["skipped"], node["sent"]) == (len(before[i]), FILES - len(before[i])), (i, node, before[i])
        assert finals(s.disk(i)) == want
        if i == 0:
            continue  # h01 pulls from its own server (the source): loopback, not its private link
        missing = SIZE * (FILES - len(before[i]))
        # What the private link received: the missing files (less any partial one resumed) with TCP/IP headers
        # and the HTTP exchange; one verified file sent again would add SIZE more.
        assert node["bytes"] <= missing and rx[i] < missing * 1.06 + 65_536 < missing + SIZE, (i, rx[i], node)
    again_rc, again, _ = s.sync()
    assert again_rc == 0 and again["bytes"] == 0, again


def test_a_flipped_source_byte_is_refused_at_the_first_node_and_reaches_no_other(setup: Setup) -> None:
    s = setup
    own_disks(s)
    bad = sorted(s.man.files)[2]
    with open(s.src_disk / bad, "r+b") as f:
        f.seek(SIZE // 2)
        byte = f.read(1)
        f.seek(SIZE // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    rc, _, err = s.sync()
    assert rc == 1 and f"{bad} is corrupt, refused at {s.rig.hosts[0].mgmt_ip}" in err, err
    assert "Traceback" not in err, err
    for i in range(4):
        held = finals(s.disk(i))
        assert bad not in held and all(s.man.files[n].sha256 == sha for n, sha in held.items()), (i, held)
        assert not (s.disk(i) / f".{bad}.k3part").exists(), i


def test_a_disk_filled_mid_copy_names_the_node_and_keeps_no_bad_file_while_the_others_finish(setup: Setup) -> None:
    s = setup
    total = SIZE * FILES
    for i, h in enumerate(s.rig.hosts):
        if i == 2:  # h03: a small disk with room for the checkpoint when the sync starts
            disks.small_disk(s.rig, h.name, s.at, total + 256 * 1024)
        else:
            disks.own_disk(s.rig, h.name, s.at, s.disk(i))
    for h in s.rig.hosts:
        disks.limit(s.rig, h.name, RATE)
    h03 = s.rig.hosts[2].name
    proc = start_sync(s)
    started = wait_for(lambda: any(not n.startswith(".") for n in on_host(s, 2)), 120)
    if started:  # once h03 holds a verified file, something else fills its disk
        s.rig.exec(h03, ["sh", "-c", f"dd if=/dev/zero of={s.at}/.filler bs=64k 2>/dev/null; true"])
    out, err = stop(proc, None if started else signal.SIGTERM, 180)
    assert started, err
    assert proc.returncode == 1 and "Traceback" not in err, err
    nodes = json.loads(out)["nodes"]
    node = nodes[2]
    assert node["disk_full"] is True and node["error"], node
    assert node["error"].startswith(f"{s.rig.hosts[2].mgmt_ip}: the disk at {s.at} filled up"), node
    assert " bytes free" in node["error"] and "bytes still needed there" in node["error"], node
    held = on_host(s, 2)
    want = {n: d.sha256 for n, d in s.man.files.items()}
    assert not any(n.endswith(".k3part") for n in held), held
    assert 0 < len([n for n in held if n != ".filler"]) < FILES, held
    assert all(want[n] == sha for n, sha in held.items() if n != ".filler"), held
    for i in (0, 1, 3):  # the others finish (h04 pulls from h02, past h03)
        assert nodes[i]["error"] is None and finals(s.disk(i)) == want, (i, nodes[i])


def test_a_node_without_room_is_refused_before_any_byte_moves(setup: Setup) -> None:
    s = setup
    for i, h in enumerate(s.rig.hosts):
        if i == 3:
            disks.small_disk(s.rig, h.name, s.at, SIZE * FILES // 2)
        else:
            disks.own_disk(s.rig, h.name, s.at, s.disk(i))
    rx0 = s.rx()
    rc, _, err = s.sync()
    rx = [b - a for a, b in zip(rx0, s.rx())]
    host = re.escape(s.rig.hosts[3].mgmt_ip)
    free = re.search(rf"{host}: ([\d,]+) bytes free at {re.escape(s.at)}, the checkpoint needs "
                     rf"{SIZE * FILES:,} more there; nothing was copied", err)
    assert rc == 1 and free is not None, err
    room = int(free.group(1).replace(",", ""))  # the tmpfs's size, in whole pages
    assert SIZE * FILES // 2 <= room < SIZE * FILES // 2 + 4096, room
    assert "Traceback" not in err and re.search(rf"free {SIZE * FILES - room:,} bytes on {host}", err), err
    assert all(finals(s.disk(i)) == {} for i in range(3)) and on_host(s, 3) == {}
    assert max(rx) < 16_384, rx  # the private links carried no file bytes (SSH goes over the management one)


def test_nodes_sharing_a_file_system_are_synced_once_and_the_others_verify_only(setup: Setup) -> None:
    s = setup
    for i, h in enumerate(s.rig.hosts):  # h01 and h02 see one directory (a shared file system); h03, h04 their own
        disks.own_disk(s.rig, h.name, s.at, s.disk(0 if i < 2 else i))
    nodes, rx = s.complete_sync()
    shared = [n["shared_with"] for n in nodes]  # HOST:PATH (FS TYPE) of the node whose storage it is
    assert shared[0] is None and shared[2:] == [None, None], nodes
    assert shared[1].startswith(f"{s.rig.hosts[0].mgmt_ip}:{s.at} ("), nodes
    assert [n["sent"] for n in nodes] == [FILES, 0, FILES, FILES], nodes
    assert rx[1] < 16_384, rx  # h02 received nothing: h01 wrote the files it sees
    want = {n: d.sha256 for n, d in s.man.files.items()}
    assert finals(s.disk(0)) == want and finals(s.disk(2)) == want and finals(s.disk(3)) == want
    assert not (s.disk(1)).exists() and not any(n.startswith(".k3deploy-shared") for n in os.listdir(s.disk(0)))
    status = cli("weights", "status", s.topo, "--manifest", s.manifest, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
