"""The small things a first-time user trips on: --version, --debug in help, completion, what `stop` of an
unknown name leaves behind, `status` of a failed deployment, the stand-in's interpreter."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import k3deploy
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.files import catalog_for, require_feasible
from tests.cli_imports import imported_by
from tests.k3deploy_cli import run_k3deploy
from tests.unit.test_launch_local import name  # noqa: F401 - the fixture checks nothing is left running
from tests.unit.test_launch_support import fake_topology

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return run_k3deploy(*args, timeout_s=50, env={"COLUMNS": str(columns)})


def test_version() -> None:
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"k3deploy {k3deploy.__version__}"


def test_help_shows_debug_and_completion() -> None:
    r = cli("--help")
    assert r.returncode == 0
    assert "--debug" in r.stdout and "--version" in r.stdout and "--install-completion" in r.stdout


def test_debug_still_works_anywhere_on_the_line(tmp_path: Path) -> None:
    r = cli("--debug", "plan", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stdout


def test_stop_of_an_unknown_name_leaves_nothing_in_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    r = cli("stop", "no-such-deployment", "--state-dir", str(state))
    assert r.returncode == 5 and "no deployment named no-such-deployment" in r.stderr
    assert sorted(p.name for p in state.iterdir()) == []


def test_status_of_a_failed_deployment_exits_4_and_shows_whole_log_paths(tmp_path: Path, name: str) -> None:  # noqa: F811
    topo = fake_topology(tmp_path, name, env={"FAKE_EXIT_RANK": "2", "FAKE_READY_DELAY_S": "30"})
    assert cli("launch", str(topo), "--skip-preflight").returncode == 4  # the fake engine's exit, not preflight
    r = cli("status", str(topo), columns=80)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "failed" in r.stdout
    lines = r.stdout.splitlines()
    for rank in range(4):
        path = str(tmp_path / "logs" / f"{name}-rank{rank}.log")
        assert any(path in line for line in lines), (path, r.stdout)
    assert json.loads(cli("status", str(topo), "--json").stdout)["status"] == "failed"
    assert cli("status", str(topo), "--json").returncode == 4


def test_logs_stop_and_status_after_import_no_httpx(tmp_path: Path, name: str) -> None:  # noqa: F811
    # httpx was most of `stop`'s fixed cost (issue 24): commands that ask no node over HTTP must not load it.
    topo = fake_topology(tmp_path, name)
    assert cli("launch", str(topo), "--skip-preflight").returncode == 0
    for argv in (["logs", str(topo)], ["stop", str(topo)], ["status", str(topo)]):
        assert imported_by(argv, ["httpx"]) == [], argv
    assert json.loads(cli("status", str(topo), "--json").stdout)["status"] == "stopped"


def _exec_argv(command: str) -> list[str]:
    line = next(ln for ln in command.splitlines() if ln.startswith("exec "))
    return shlex.split(command[command.index(line):].replace("\\\n", " "))[1:]


def test_local_stand_in_runs_under_this_interpreter_remote_nodes_get_python3() -> None:
    cat = catalog_for(None)
    plan = require_feasible(ROOT / "topologies" / "local-demo.yaml", cat)
    local = jobs_for(plan, None, cat)
    assert all(_exec_argv(j.command)[:3] == [sys.executable, "-m", "k3deploy.sim"] for j in local)
    remote = jobs_for(plan, ExecOverrides(executor="ssh"), cat)
    assert all(_exec_argv(j.command)[:3] == ["python3", "-m", "k3deploy.sim"] for j in remote)
