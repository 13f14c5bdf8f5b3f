"""vLLM's ZMQ IPC sockets: each launch left about nine in /tmp on every node, never removed (72 after 8
launches). Each started node now gets its own VLLM_RPC_BASE_PATH, which stop removes with what is in it."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.errors import ExecError
from k3deploy.executors.base import EXIT_MARK, Executor, ProcessHandle
from k3deploy.executors.factory import open_executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.launch.gang import Gang
from k3deploy.launch.ipc import IPC_PREFIX, ipc_dir, with_ipc_dir
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.records.store import StateStore
from tests.polling import wait_for
from tests.unit.test_launch_local import cli
from tests.unit.test_launch_support import assert_nothing_left, fake_topology, tagged_pids
from tests.unit.test_render_support import plan_of, sim_doc

pytestmark = pytest.mark.timeout(120)
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


class HeldStart:
    """The local executor, whose worker starts wait (after their node has made its IPC directory) until the
    test lets them return: a start that returns once the group's stop has gone by (gang.start's late path)."""

    def __init__(self, inner: Executor, rank: int, arrived: threading.Event, go: threading.Event) -> None:
        self.inner, self.rank, self.arrived, self.go = inner, rank, arrived, go

    def start(self, command: str, log_path: str, workdir: str = "/", tag: str = "") -> ProcessHandle:
        handle = self.inner.start(command, log_path, workdir, tag)
        if self.rank:
            assert wait_for(lambda: os.path.isdir(ipc_dir(tag)), 30), "the node made no IPC directory"
            self.arrived.set()
            assert self.go.wait(60), "never let go"
        return handle

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


def test_a_node_started_as_its_group_is_stopped_leaves_no_ipc_dir(tmp_path: Path, name: str) -> None:
    jobs = [j.model_copy(update={"command": "sleep 600", "log_path": str(tmp_path / f"{name}-rank{j.rank}.log")})
            for j in jobs_for(plan_of(sim_doc(name=name)))[:2]]
    arrived, go = threading.Event(), threading.Event()
    ranks = iter(range(len(jobs)))
    fleet = NodeFleet({j.rank: j.target for j in jobs},
                      lambda t: HeldStart(open_executor(t), next(ranks), arrived, go))  # type: ignore[arg-type,return-value]
    gang = Gang(name, jobs, fleet)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            gang.start("r1")
        except ExecError as exc:
            errors.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    try:
        assert arrived.wait(60), "the worker never started"
        assert gang.stop(grace_s=2) == {0: "stopped"}  # rank 1's start has not returned: the stop misses it
    finally:
        go.set()
        starter.join(60)
        gang.close()
    assert [str(e) for e in errors] == ["localhost: started as the group was being stopped; stopped again"]
    assert not tagged_pids(f"{name}.")
    assert [d for d in (ipc_dir(j.tag(name, "r1")) for j in jobs) if os.path.exists(d)] == []


def _started(tmp_path: Path, tag: str, command: str = "exec sleep 600") -> tuple[Executor, ProcessHandle]:
    """One node's shell text (with its IPC directory) started as launch starts it, on this machine."""
    ex = open_executor(jobs_for(plan_of(sim_doc()))[0].target)
    handle = ex.start(with_ipc_dir(command, tag), str(tmp_path / f"{tag}.log"), tag=tag)
    assert wait_for(lambda: os.path.isdir(ipc_dir(tag)), 30), "the node made no IPC directory"
    return ex, handle


@pytest.mark.parametrize("how", ["SIGTERM to the group", "SIGKILL to the engine alone"])
def test_the_node_removes_its_ipc_dir_when_its_engine_ends_without_stop(tmp_path: Path, how: str) -> None:
    # Slurm's scancel and time limit, and the Ray agent's watchdog, SIGTERM the node's whole group: no
    # `stop` follows that could reach the node; an engine killed alone leaves its shell behind.
    tag = f"ut-ipc-end-{os.getpid()}.0.r1"
    ex, handle = _started(tmp_path, tag)
    assert handle.pid is not None
    try:
        if how == "SIGTERM to the group":
            os.killpg(handle.pid, signal.SIGTERM)
        else:
            (engine,) = [p for p in tagged_pids(tag) if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep")]
            os.kill(engine, signal.SIGKILL)
        assert wait_for(lambda: not tagged_pids(tag), 30), tagged_pids(tag)
        assert wait_for(lambda: not os.path.exists(ipc_dir(tag)), 10), "the IPC directory was left"
        # The engine's own end is what the exit line reports, not the removal's.
        want = "143" if how == "SIGTERM to the group" else "137"
        assert f"{EXIT_MARK} {want} at " in ex.read_log(handle, 5)
    finally:
        ex.terminate(handle, 1)
        shutil.rmtree(ipc_dir(tag), ignore_errors=True)
        ex.close()


def test_an_engine_that_exits_by_itself_keeps_its_status_and_leaves_no_ipc_dir(tmp_path: Path) -> None:
    tag = f"ut-ipc-exit-{os.getpid()}.0.r1"
    ex, handle = _started(tmp_path, tag, "set -eu\nsleep 0.5\nexit 3")
    try:
        assert wait_for(lambda: not tagged_pids(tag), 30), tagged_pids(tag)
        assert not os.path.exists(ipc_dir(tag))
        assert f"{EXIT_MARK} 3 at " in ex.read_log(handle, 5)
    finally:
        shutil.rmtree(ipc_dir(tag), ignore_errors=True)
        ex.close()
