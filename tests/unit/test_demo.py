"""`k3deploy demo`: writes the tiny checkpoint, plans, launches 4 local stand-in nodes, validates with every
stage that exists, prints the report and stops (nothing left); `--keep` leaves it serving and says how."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from k3deploy.demo import DEMO_NAME
from k3deploy.validate.stages import IMPLEMENTED
from tests.k3deploy_cli import run_k3deploy

pytestmark = [pytest.mark.timeout(150), pytest.mark.torch]  # four stand-in nodes rendezvous over Gloo


def k3(*args: str) -> subprocess.CompletedProcess[str]:
    return run_k3deploy(*args, timeout_s=140)


def nodes_alive(state: Path) -> list[bool]:
    status = json.loads(k3("status", DEMO_NAME, "--state-dir", str(state), "--json").stdout)
    return [n["alive"] for n in status["nodes"]]


def test_demo_runs_the_whole_flow_and_leaves_nothing_running(tmp_path: Path) -> None:
    run = k3("demo", "--dir", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "kimi-k3-tiny" / "config.json").is_file() and (tmp_path / "demo.yaml").is_file()
    for name in IMPLEMENTED:  # every stage that exists ran and passed, live and in the report
        assert f"{name}: pass in " in run.stderr
        assert re.search(rf"│ {re.escape(name)} +│ PASS", run.stdout), run.stdout
    assert "rank 3 localhost: ready" in run.stderr and "PASSED" in run.stdout
    assert f"{DEMO_NAME} stopped; nothing left running" in run.stderr
    assert nodes_alive(tmp_path / "state") == [False] * 4
    status = json.loads(k3("status", DEMO_NAME, "--state-dir", str(tmp_path / "state"), "--json").stdout)
    assert status["status"] == "stopped" and status["supervised"] is False


def test_demo_keep_leaves_it_serving_and_says_how_to_reach_it(tmp_path: Path) -> None:
    run = k3("demo", "--dir", str(tmp_path), "--keep")
    state = tmp_path / "state"
    try:
        assert run.returncode == 0, run.stdout + run.stderr
        url = re.search(r"keeps running at (http://\S+)", run.stdout)
        assert url is not None, run.stdout
        assert nodes_alive(state) == [True] * 4
        curl = next(line.strip() for line in run.stdout.splitlines() if line.strip().startswith("curl "))
        body = json.loads(shlex.split(curl)[-1])  # the printed request, sent as printed
        reply = httpx.post(f"{url.group(1)}/v1/chat/completions", json=body, timeout=30, trust_env=False)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text
        stop = next(line.strip() for line in run.stdout.splitlines() if line.strip().startswith("k3deploy stop"))
        done = k3(*shlex.split(stop)[1:])
        assert done.returncode == 0, done.stderr
    finally:
        k3("stop", DEMO_NAME, "--state-dir", str(state))
    assert nodes_alive(state) == [False] * 4
