"""`weights status` and `weights sync` over SSH on four network-namespace hosts: with each host's own copy at the
checkpoint path (a bind mount in its own mount namespace, as real nodes have their own disks) every node is hashed
on its own; with the path one storage for all (no bind: the hosts share this machine's filesystem, as nodes share
an NFS or Lustre mount) the storage is found by the marks the nodes leave, hashed once and synced once."""
from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
import yaml

from k3deploy.checkpoint.manifest import Manifest
from tests.integration.test_validate_ssh import hosts_empty, ssh_launch
from tests.integration.validate_rig import ROUNDS, RigNodes
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig

pytestmark = pytest.mark.integration


def _rows(run: Any) -> list[dict[str, Any]]:
    return list(json.loads(run.stdout)["nodes"])


@pytest.mark.timeout(300)
def test_own_disks_are_hashed_each_and_one_shared_storage_is_hashed_and_synced_once(nodes: RigNodes,
                                                                                   rig4: HostRig) -> None:
    clean = nodes.copies["clean"]
    manifest = nodes.tmp / "weights-manifest.json"
    Manifest.load(clean).save(manifest)
    total = sum(d.size for d in Manifest.load(manifest).files.values())
    topo = nodes.topology("w-shared", ssh_launch(rig4), manifest)
    doc = yaml.safe_load(topo.read_text())
    doc["serving"] = {"context_length": 32768, "max_running_requests": 16}  # a plan `weights` accepts
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    head = rig4.hosts[0].mgmt_ip

    nodes.bind(ROUNDS["a"])  # each host its own copy: rank 0 clean, the others each with one fault
    own = cli("weights", "status", topo, "--json")
    assert own.returncode == 1, own.stdout + own.stderr
    rows = _rows(own)
    assert [r["shared_with"] for r in rows] == [None] * 4, rows
    assert [r["complete"] for r in rows] == [True, False, False, False], rows

    nodes.unbind()  # one directory for all four: empty
    try:
        shared = cli("weights", "status", topo, "--json")
        assert shared.returncode == 1, shared.stdout + shared.stderr
        rows = _rows(shared)
        assert rows[0]["shared_with"] is None and all(
            r["shared_with"].startswith(f"{head}:{nodes.path} (") for r in rows[1:]), rows
        assert json.loads(shared.stdout)["bytes_to_go"] == total  # counted once, not four times

        synced = cli("weights", "sync", topo, "--from", str(clean), "--json")
        assert synced.returncode == 0, synced.stdout + synced.stderr
        rows = _rows(synced)
        assert rows[0]["sent"] == len(Manifest.load(manifest).files) and rows[0]["shared_with"] is None, rows
        assert all(r["sent"] == 0 and r["shared_with"] for r in rows[1:]), rows
        done = cli("weights", "status", topo)
        assert done.returncode == 0 and "storage of" in done.stdout, done.stdout + done.stderr  # the table wraps
        assert not list(nodes.path.glob(".k3deploy-shared-*"))
    finally:
        for entry in nodes.path.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    assert hosts_empty(rig4)
