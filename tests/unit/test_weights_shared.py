"""Shared storage for `weights`: nodes whose checkpoint directory is one filesystem (NFS, Lustre, a bind of one
disk) are found by a mark each node leaves and the others see; they are hashed and synced once. Here on local
executors, where a symlink stands in for a second mount of the same storage."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.executors.fleet import NodeFleet
from k3deploy.executors.target import LocalTarget
from k3deploy.launch.weights import shared_storage

pytestmark = pytest.mark.timeout(120)


def test_nodes_that_see_each_others_mark_share_storage_and_no_mark_is_left(tmp_path: Path) -> None:
    (tmp_path / "disk0" / "ckpt").mkdir(parents=True)
    (tmp_path / "disk2" / "ckpt").mkdir(parents=True)
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "ckpt").symlink_to(tmp_path / "disk0" / "ckpt")  # the same storage, another path
    (tmp_path / "not-a-dir").write_text("")
    paths = {0: str(tmp_path / "disk0" / "ckpt"), 1: str(tmp_path / "n1" / "ckpt"),
             2: str(tmp_path / "disk2" / "ckpt"),  # its own storage
             3: str(tmp_path / "disk2" / "ckpt"),  # the same directory as rank 2
             4: str(tmp_path / "not-a-dir" / "ckpt"),  # above it a file: marked in tmp_path, seen by none
             5: str(tmp_path / "new5" / "ckpt"), 6: str(tmp_path / "new6" / "ckpt"),  # both marked in tmp_path:
             7: str(tmp_path / "new5" / "ckpt")}  # two directories still to make, but 7's is 5's
    with NodeFleet({r: LocalTarget(host="localhost") for r in paths}) as fleet:
        shared = shared_storage(fleet, list(paths), paths)
    assert shared.owner == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 5, 6: 6, 7: 5}
    assert not (tmp_path / "not-a-dir").is_dir()  # nothing was made: rank 4 left its mark in tmp_path
    assert not (tmp_path / "new5").exists()
    assert shared.owners == [0, 2, 4, 5, 6]
    assert shared.fs[0] not in ("", "unknown")  # read from /proc/mounts
    left = [p for p in tmp_path.rglob(".k3deploy-shared-*")]
    assert left == []
