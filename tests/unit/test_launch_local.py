"""Launch, gang teardown and the CLI contract, on the local executor with a fake engine that starts in
milliseconds (supervision and restarts: test_launch_supervision.py; the SSH rig and the real stand-in engine
are in tests/integration)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from k3deploy.errors import StateError
from k3deploy.launch import deploy
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.records.store import StateStore
from tests import sweep
from tests.k3deploy_cli import run_k3deploy, start_k3deploy
from tests.polling import wait_for
from tests.unit.test_launch_support import (
    assert_nothing_left,
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
