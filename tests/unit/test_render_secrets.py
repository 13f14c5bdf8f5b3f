"""Secrets in `render --format json` have their own key, say where they are resolved, and warn when a node
will get nothing."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "topologies" / "h100-4x8-sglang.yaml"
FAKE = "hf_" + "Zx9" * 10


def render(path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    return run_k3deploy("render", path, *args, timeout_s=50, env=env, environ=base)


def test_json_keeps_secret_references_out_of_env() -> None:
    r = render(H100, "--format", "json", env={})
    assert r.returncode == 0, r.stderr
    node = json.loads(r.stdout)["nodes"][0]
    assert "HF_TOKEN" not in node["env"]
    assert node["secrets"] == [{"name": "HF_TOKEN", "ref": "env:HF_TOKEN", "resolved_on": "node",
                                "source": "the environment of the engine's process on node gpu-a "
                                          "(what the SSH login gives it), variable HF_TOKEN"}]


def test_secret_set_only_here_warns_it_is_not_sent_over_ssh() -> None:
    r = render(H100, "--format", "json", env={"HF_TOKEN": FAKE})
    assert r.returncode == 0
    assert "HF_TOKEN is set on this machine but is not sent" in r.stderr and "[SECRET_NOT_SENT]" in r.stderr
    assert FAKE not in r.stdout + r.stderr


def test_local_secret_missing_here_warns_it_will_be_empty(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies" / "local-demo.yaml").read_text())
    doc["engine"]["secrets"] = {"HF_TOKEN": "env:HF_TOKEN"}
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = render(path, env={})
    assert r.returncode == 0 and "HF_TOKEN will be empty" in r.stderr and "[SECRET_EMPTY]" in r.stderr
    assert "SECRET_" not in render(path, env={"HF_TOKEN": FAKE}).stderr  # set here, used here
