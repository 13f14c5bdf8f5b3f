"""Validation on the namespace rig: each host sees its own checkpoint copy at the same path (a bind mount in
the host's own mount namespace), as real nodes have their own disks; the rounds that seed every fault."""
from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from k3deploy.checkpoint.manifest import Manifest
from tests.rig import HostRig
from tests.validate_nodes import FAULT_SHARD, write_nodes

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


class RigNodes:
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

    def topology(self, name: str, launch: dict[str, Any], manifest: Path | None = None) -> Path:
        doc = {"name": name, "model": {"id": "kimi-k3-tiny", "path": str(self.path)},
               "hardware": {"gpu": "sim", "gpus_per_node": 1},
               "nodes": [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in self.rig.hosts],
               "engine": {"kind": "sim", "mimic": "sglang"}, "parallel": {"tp": 4, "ep": 4},
               "launch": {"state_dir": str(self.tmp / "state"), **launch},
               "validate": {"manifest": str(manifest)} if manifest else {}}
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path



def check_round(nodes: RigNodes, round_name: str, launch: dict[str, Any],
                cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """Bind a round's copies, validate against the clean manifest, and check every node's row and the JUnit."""
    from junitparser import Failure, JUnitXml

    kinds = ROUNDS[round_name]
    nodes.bind(kinds)
    manifest = nodes.tmp / "pinned.json"
    Manifest.load(nodes.copies["clean"]).save(manifest)
    junit = nodes.tmp / f"junit-{round_name}.xml"
    done = cli("validate", str(nodes.topology(f"v-{round_name}", launch, manifest)), "--json", "--junit", str(junit))
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {n["rank"]: n for n in json.loads(done.stdout)["stages"][0]["nodes"]}
    for rank, kind in enumerate(kinds):
        if kind == "clean":
            assert rows[rank]["status"] == "pass", rows[rank]
            continue
        assert rows[rank]["status"] == "fail" and rows[rank]["host"] == nodes.rig.hosts[rank].mgmt_ip
        assert any(re.fullmatch(EXPECTED[kind], p) for p in rows[rank]["problems"]), (kind, rows[rank]["problems"])
    cases = list(next(iter(JUnitXml.fromfile(str(junit)))))
    failing = sorted(c.name for c in cases if c.result and isinstance(c.result[0], Failure))
    faulty = [r for r, k in enumerate(kinds) if k != "clean"]
    assert failing == [f"shards node {r} ({nodes.rig.hosts[r].mgmt_ip})" for r in faulty]


def check_clean(nodes: RigNodes, launch: dict[str, Any], cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """Every host on a clean copy: validate passes and names every host."""
    nodes.bind(["clean"] * len(nodes.rig.hosts))
    done = cli("validate", str(nodes.topology("v-clean", launch)), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    stage = json.loads(done.stdout)["stages"][0]
    assert [(n["rank"], n["host"], n["status"]) for n in stage["nodes"]] == [
        (i, h.mgmt_ip, "pass") for i, h in enumerate(nodes.rig.hosts)]
