"""The SSH and Ray options are one set (cli.common.CONNECTION_OPTIONS) that launch, preflight and rollout all
take: each lists every one, just before --state-dir/--catalog, and a value given on the command line reaches
every node's target."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer.main

from k3deploy.cli import build_app
from k3deploy.cli.common import CONNECTION_OPTIONS
from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
NAMES = [p.name for p in CONNECTION_OPTIONS]


@pytest.mark.parametrize("command", ["launch", "preflight", "rollout"])
def test_each_command_lists_the_one_set_before_its_trailing_options(command: str) -> None:
    click_cmd = typer.main.get_command(build_app(command)).commands[command]  # type: ignore[attr-defined]
    params = [p.name for p in click_cmd.params]
    start = params.index(NAMES[0])
    assert params[start:start + len(NAMES)] == NAMES
    assert params[start + len(NAMES):] in (["state_dir", "catalog"], ["catalog"])
    flags = {p.name: p.opts for p in click_cmd.params}
    assert flags["ssh_jump"] == ["--ssh-jump"] and flags["connect_timeout_s"] == ["--connect-timeout"]


def test_launch_passes_every_connection_option_to_each_node() -> None:
    topo = str(ROOT / "topologies" / "h200-2x8-sglang.yaml")
    run = run_k3deploy("launch", topo, "--dry-run", "--json", "--executor", "ssh", "--ssh-user", "bob",
                       "--ssh-key", "/keys/id", "--known-hosts", "/keys/kh", "--ssh-config", "/dev/null",
                       "--connect-timeout", "7", "--ssh-jump", "root@10.0.0.9", "--accept-new-host-keys",
                       timeout_s=100)
    assert run.returncode == 0, run.stderr
    targets = [job["target"] for job in json.loads(run.stdout)]
    assert len(targets) == 2
    for t in targets:
        assert (t["kind"], t["user"], t["key"], t["known_hosts"], t["ssh_config"]) == \
            ("ssh", "bob", "/keys/id", "/keys/kh", "/dev/null")
        assert (t["connect_timeout_s"], t["jump"], t["accept_new_host_keys"]) == (7.0, "root@10.0.0.9", True)
    ray = run_k3deploy("launch", topo, "--dry-run", "--json", "--executor", "ray", "--ray-address",
                       "10.1.1.1:6379", timeout_s=100)
    assert ray.returncode == 0, ray.stderr
    assert {job["target"]["ray_address"] for job in json.loads(ray.stdout)} == {"10.1.1.1:6379"}
