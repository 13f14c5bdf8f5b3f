"""`k3deploy validate` over SSH on four network-namespace hosts: each host sees its own checkpoint copy at the
same path (a bind mount inside the host's mount namespace), as real nodes have their own disks. A clean
checkpoint passes; each seeded fault is caught by `shards` on its node with the file named; --junit has one
failing testcase per fault; nothing is left running on any host."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from k3deploy.checkpoint.manifest import Manifest
from tests.integration.sim_deployments import cli
from tests.polling import wait_for
from tests.rig import HostRig
from tests.validate_nodes import FAULT_SHARD, write_nodes

pytestmark = pytest.mark.integration
SHARD = f"shard {FAULT_SHARD:05d}"
# Two rounds over four hosts seed all five faults; rank 0 stays clean in both.
ROUNDS = {"a": ["clean", "truncate", "flip", "missing-tensor"], "b": ["clean", "wrong-dtype", "revision", "clean"]}
EXPECTED = {
    "truncate": rf"{SHARD}: [\d,]+ bytes short \(file [\d,]+, header says [\d,]+\)",
    "flip": rf"{SHARD}: sha256 [0-9a-f]{{12}}… differs from the manifest's [0-9a-f]{{12}}…",
    "missing-tensor": rf"{SHARD}: tensor language_model\.\S+\.weight_scale missing from {SHARD}",
    "wrong-dtype": rf"{SHARD}: tensor \S+: dtype F16, expected BF16",
    "revision": r"revision tiny-r2, the manifest's is tiny-r1; 4 files differ: shard 00001, shard 00002, "
                r"shard 00003, shard 00004",
}


class Nodes:
    """Per-host checkpoint copies bound at one path inside each host's own mount namespace."""

    def __init__(self, rig: HostRig, tmp: Path) -> None:
        self.rig, self.tmp = rig, tmp
        self.path = tmp / "mnt" / "kimi-k3-tiny"
        self.path.mkdir(parents=True)
        self.copies = {kind: root for kinds in ROUNDS.values()
                       for kind, root in zip(kinds, write_nodes(tmp / "copies" / kinds[1], kinds).values(),
                                             strict=True)}
        self.bound: list[str] = []

    def bind(self, kinds: list[str]) -> None:
        self.unbind()
        for host, kind in zip(self.rig.hosts, kinds, strict=True):
            done = self.rig.exec(host, ["mount", "--bind", str(self.copies[kind]), str(self.path)])
            assert done.returncode == 0, done.stderr
            self.bound.append(host.name)

    def unbind(self) -> None:
        for name in self.bound:
            self.rig.exec(name, ["umount", str(self.path)])
        self.bound = []

    def topology(self, name: str, manifest: Path | None = None) -> Path:
        doc = {"name": name, "model": {"id": "kimi-k3-tiny", "path": str(self.path)},
               "hardware": {"gpu": "sim", "gpus_per_node": 1},
               "nodes": [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in self.rig.hosts],
               "engine": {"kind": "sim", "mimic": "sglang"}, "parallel": {"tp": 4, "ep": 4},
               "launch": {"executor": "ssh", "state_dir": str(self.tmp / "state"), "ssh": {
                   "user": "root", "key": str(self.rig.key_path), "known_hosts": str(self.rig.known_hosts_path),
                   "connect_timeout_s": 2}},
               "validate": {"manifest": str(manifest)} if manifest else {}}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


@pytest.fixture(scope="module")
def nodes(rig4: HostRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    made = Nodes(rig4, tmp_path_factory.mktemp("validate"))
    yield made
    made.unbind()


def hosts_empty(rig: HostRig) -> bool:
    """Nothing but the sshd master left in any host once the probes' sessions closed."""
    return wait_for(lambda: not any(rig.pids(h) for h in rig.hosts), 10.0)


@pytest.mark.timeout(120)
def test_a_clean_checkpoint_passes_on_every_host(nodes: Nodes, rig4: HostRig) -> None:
    nodes.bind(["clean"] * 4)
    done = cli("validate", str(nodes.topology("v-clean")), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    stage = json.loads(done.stdout)["stages"][0]
    assert [(n["rank"], n["host"], n["status"]) for n in stage["nodes"]] == [
        (i, h.mgmt_ip, "pass") for i, h in enumerate(rig4.hosts)]
    assert hosts_empty(rig4)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("round_name", sorted(ROUNDS))
def test_each_fault_is_caught_on_its_host_with_the_file_named(nodes: Nodes, rig4: HostRig, round_name: str) -> None:
    from junitparser import Failure, JUnitXml

    kinds = ROUNDS[round_name]
    nodes.bind(kinds)
    manifest = nodes.tmp / "pinned.json"
    Manifest.load(nodes.copies["clean"]).save(manifest)
    junit = nodes.tmp / f"junit-{round_name}.xml"
    done = cli("validate", str(nodes.topology(f"v-{round_name}", manifest)), "--json", "--junit", str(junit))
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {n["rank"]: n for n in json.loads(done.stdout)["stages"][0]["nodes"]}
    for rank, kind in enumerate(kinds):
        if kind == "clean":
            assert rows[rank]["status"] == "pass", rows[rank]
            continue
        assert rows[rank]["status"] == "fail" and rows[rank]["host"] == rig4.hosts[rank].mgmt_ip
        assert any(re.fullmatch(EXPECTED[kind], p) for p in rows[rank]["problems"]), (kind, rows[rank]["problems"])
    cases = list(next(iter(JUnitXml.fromfile(str(junit)))))
    failing = sorted(c.name for c in cases if c.result and isinstance(c.result[0], Failure))
    faulty = [r for r, k in enumerate(kinds) if k != "clean"]
    assert failing == [f"shards node {r} ({rig4.hosts[r].mgmt_ip})" for r in faulty]
    assert hosts_empty(rig4)
