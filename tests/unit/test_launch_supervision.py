"""Supervision of a ready local deployment (fake engine): a node that dies stops the group (the restart
policy: test_launch_sequencing.py, on the recording executor), a host gone silent is failed, no node
answering at all is not every node dead."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from k3deploy.errors import ExecError
from k3deploy.executors.base import CommandResult
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.target import ExecTarget
from k3deploy.launch import deploy
from k3deploy.launch.events import NodeEvent
from k3deploy.launch.supervisor import Supervisor
from tests import figures
from tests.polling import wait_for
from tests.unit.test_launch_local import cli, launch_lib, name
from tests.unit.test_launch_support import (
    assert_supervisor_stopped_group,
    fake_topology,
    tagged_pids,
)

__all__ = ["name"]  # fixtures


def _engine_pid(name: str, rank: int) -> int:
    """The fake engine process (not the wrapper shell) of one rank."""
    for pid in tagged_pids(f"{name}.{rank}."):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith("fake_engine.py"):  # the wrapper only mentions it
            return pid
    raise AssertionError(f"no engine process for rank {rank}")


@pytest.mark.parametrize("rank", [2, 0], ids=["worker", "head"])
def test_supervisor_stops_all_when_a_worker_dies_after_ready(tmp_path: Path, name: str, rank: int) -> None:
    topo = fake_topology(tmp_path, name)
    store, _ = launch_lib(topo)
    rec = store.require(name)
    supervisor = rec.owner
    assert supervisor is not None and supervisor.role == "supervisor" and supervisor.alive()
    victim = _engine_pid(name, rank=rank)
    os.kill(victim, signal.SIGKILL)
    figures.fault_injected()
    # Bounded for a loaded machine; what shows supervision stopped the group is the supervisor's log order.
    assert wait_for(lambda: store.require(name).status == "failed" and not tagged_pids(f"{name}.")
                    and not supervisor.alive(), 60)  # its log is whole once it has exited
    assert_supervisor_stopped_group(tmp_path / "state" / f"{name}.supervisor.log", rank,
                                    [r for r in range(4) if r != rank])
    rec = store.require(name)
    assert rec.failure is not None and (rec.failure.rank, rec.failure.host) == (rank, "localhost")
    assert "killed by SIGKILL" in rec.failure.cause
    assert rec.owner is None and wait_for(lambda: not supervisor.alive(), 5)  # gave up (no restarts)
    st = json.loads(cli("status", name, "--state-dir", str(tmp_path / "state"), "--json").stdout)
    assert st["failure"]["rank"] == rank and st["status"] == "failed"


class _Unreachable(LocalExecutor):
    """A local node whose host stops answering once `down` is set."""

    down = False

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0) -> CommandResult:
        if _Unreachable.down:
            raise ExecError("cannot connect after 3 attempts: timed out", host=self.host)
        return super().run(command, timeout_s)


def test_supervisor_treats_a_host_gone_silent_as_failed(tmp_path: Path, name: str) -> None:
    nodes = [{"host": f"n{i}", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(4)]
    topo = fake_topology(tmp_path, name, nodes=4, launch={"executor": "local"})
    doc = yaml.safe_load(topo.read_text())
    doc["nodes"] = nodes
    topo.write_text(yaml.safe_dump(doc))
    store, _ = launch_lib(topo, background=False)  # this test process owns it and supervises in-process

    def factory(target: ExecTarget) -> LocalExecutor:
        return _Unreachable(target.host) if target.host == "n2" else LocalExecutor(target.host)

    _Unreachable.down = True
    try:
        final = Supervisor(store, name, factory=factory, poll_s=0.1).run()
    finally:
        _Unreachable.down = False
    assert final.status == "failed" and final.owner is None
    assert final.failure is not None and (final.failure.rank, final.failure.host) == (2, "n2")
    assert final.failure.cause.startswith("unreachable: n2: cannot connect")
    assert [n.phase for n in final.nodes] == ["stopped", "stopped", "unknown", "stopped"]
    assert tagged_pids(f"{name}.0.") == tagged_pids(f"{name}.1.") == tagged_pids(f"{name}.3.") == []
    deploy.stop(store, name)  # the host is back: stop reaches it
    assert tagged_pids(f"{name}.") == []


def test_supervisor_keeps_a_deployment_when_no_node_answers_at_all(tmp_path: Path, name: str) -> None:
    """This machine's network (or the jump host) down is not every node dead: nothing is torn down."""
    topo = fake_topology(tmp_path, name, nodes=4, launch={"executor": "local"})
    store, _ = launch_lib(topo, background=False)
    events: list[NodeEvent] = []
    stop_event = threading.Event()
    supervisor = Supervisor(store, name, factory=lambda t: _Unreachable(t.host), on_event=events.append,
                            stop_event=stop_event, poll_s=0.1)
    watcher = threading.Thread(target=supervisor.run)
    _Unreachable.down = True
    watcher.start()
    try:
        assert wait_for(lambda: any(e.phase == "unreachable" for e in events), 20), events
        time.sleep(0.5)  # several more polls in which nothing answers
    finally:
        _Unreachable.down = False
    assert wait_for(lambda: any(e.phase == "reachable" for e in events), 20), events
    stop_event.set()
    watcher.join(20)
    dep = store.require(name)
    assert dep.status == "ready" and dep.failure is None and not any(e.phase == "failed" for e in events)
    assert all(tagged_pids(f"{name}.{rank}.") for rank in range(4))  # every engine still runs
    deploy.stop(store, name)
    assert tagged_pids(f"{name}.") == []
