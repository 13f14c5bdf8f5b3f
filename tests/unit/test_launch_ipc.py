"""vLLM's ZMQ IPC sockets: each launch left about nine in /tmp on every node, never removed (72 after 8
launches). Each started node now gets its own VLLM_RPC_BASE_PATH, which stop removes with what is in it."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.launch.ipc import IPC_PREFIX, ipc_dir
from k3deploy.launch.state import StateStore
from tests.unit.test_launch_local import cli
from tests.unit.test_launch_support import assert_nothing_left, fake_topology

SOCKETS = 3


@pytest.fixture
def name(tmp_path: Path) -> Iterator[str]:
    dep_name = f"ut-ipc-{os.getpid() % 100000}"
    yield dep_name
    assert_nothing_left(dep_name, tmp_path / "state")


def _sockets(d: str) -> list[str]:
    return [n for n in os.listdir(d) if stat.S_ISSOCK(os.lstat(os.path.join(d, n)).st_mode)]


def test_stop_removes_every_nodes_ipc_sockets(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name, nodes=2, env={"FAKE_IPC_SOCKETS": str(SOCKETS)})
    run = cli("launch", str(topo))
    assert run.returncode == 0, run.stderr
    dep = StateStore(tmp_path / "state").require(name)
    dirs = [ipc_dir(n.handle.tag) for n in dep.nodes if n.handle is not None]
    assert len(set(dirs)) == 2 and all(d.startswith(IPC_PREFIX) for d in dirs)
    # The sockets are bound where the node's engine was pointed, none loose in /tmp.
    assert all(len(_sockets(d)) == SOCKETS for d in dirs), [os.listdir(d) for d in dirs]
    stop = cli("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    assert not any(os.path.exists(d) for d in dirs)


def test_the_ipc_dir_fits_a_unix_socket_path_whatever_the_name() -> None:
    tag = f"{'x' * 63}.31.{'f' * 32}"
    assert len(ipc_dir(tag)) + 1 + 36 <= 107 and ipc_dir(tag) != ipc_dir(tag.replace(".31.", ".30."))
