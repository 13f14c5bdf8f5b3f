"""Node exits are seen on each node's stream, not on a poll; `stop` hands its work to a running supervisor.
Local executor, fake engine (tests/unit/test_launch_support.py)."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from k3deploy.launch import deploy
from k3deploy.launch.events import NodeEvent
from k3deploy.launch.supervisor import Supervisor
from k3deploy.records.store import StateStore
from tests.polling import wait_for
from tests.unit.test_launch_local import cli, launch_lib, name  # noqa: F401 - `name` is a fixture
from tests.unit.test_launch_supervision import _engine_pid
from tests.unit.test_launch_support import fake_topology, tagged_pids


@pytest.mark.timeout(60)
def test_supervisor_sees_an_exit_on_the_stream_without_any_poll(tmp_path: Path, name: str) -> None:  # noqa: F811
    topo = fake_topology(tmp_path, name)
    store, _ = launch_lib(topo, background=False)  # this test process owns it and supervises in-process
    events: list[NodeEvent] = []
    # No `alive` round in the life of this test: only the nodes' streams can tell the supervisor anything.
    supervisor = Supervisor(store, name, on_event=events.append, poll_s=10_000)
    watcher = threading.Thread(target=supervisor.run)
    watcher.start()
    try:
        assert wait_for(lambda: supervisor.gang is not None, 10)
        os.kill(_engine_pid(name, rank=2), signal.SIGKILL)
        watcher.join(30)
    finally:
        supervisor.stop_event.set()
    assert not watcher.is_alive()
    rec = store.require(name)
    assert rec.status == "failed" and rec.failure is not None and rec.failure.rank == 2, rec.failure
    assert "killed by SIGKILL" in rec.failure.cause
    assert [e.phase for e in events if e.rank == -1] == ["failed"]
    assert tagged_pids(f"{name}.") == []


@pytest.mark.timeout(60)
def test_stop_hands_the_nodes_to_the_running_supervisor(tmp_path: Path, name: str) -> None:  # noqa: F811
    topo = fake_topology(tmp_path, name)
    store, _ = launch_lib(topo)
    log = tmp_path / "state" / f"{name}.supervisor.log"
    assert wait_for(lambda: log.exists() and "supervising" in log.read_text(), 20)
    stop = cli("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    assert [f"rank {r} localhost: stopped" for r in range(4)] == stop.stdout.splitlines()[:4]
    text = log.read_text()
    # The supervisor stopped every node over its own connections and said so, then exited.
    assert all(f"rank {r} localhost: stopped" in text for r in range(4)), text
    assert "supervisor exits; deployment stopped" in text
    rec = StateStore(tmp_path / "state").require(name)
    assert rec.status == "stopped" and rec.owner is None and {n.phase for n in rec.nodes} == {"stopped"}
    assert tagged_pids(f"{name}.") == []
    assert "exited with status 143" in cli("logs", str(topo), "--node", "1").stdout  # its local copy was kept
    deploy.stop(store, name)  # idempotent: nothing left to reach
