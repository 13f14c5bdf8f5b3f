"""`k3deploy validate` and its reports from the command line, on local "nodes" (executor: local)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cli_imports import imported_by
from tests.k3deploy_cli import run_k3deploy
from tests.validate_nodes import topology_file

pytestmark = pytest.mark.timeout(120)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_k3deploy(*args, timeout_s=100)


def local_topology(tmp: Path, checkpoint: Path, **validate: object) -> Path:
    path = topology_file(tmp, "v", 2, str(checkpoint), **validate)
    doc = yaml.safe_load(path.read_text())
    doc["nodes"] = [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(2)]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_pass_json_and_junit(tmp_path: Path, checkpoint: Path) -> None:
    from junitparser import JUnitXml

    shutil.copy(checkpoint / "k3-manifest.json", tmp_path / "pinned.json")
    topo = local_topology(tmp_path, checkpoint, manifest="pinned.json")  # relative to the topology file
    done = cli("validate", str(topo), "--only", "shards", "--json", "--junit", str(tmp_path / "j.xml"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True and report["stages"][0]["name"] == "shards"
    assert "manifest revision tiny-r1" in report["stages"][0]["detail"]
    assert "shards: pass" in done.stderr
    cases = [c for c in next(iter(JUnitXml.fromfile(str(tmp_path / "j.xml")))) if c.name.startswith("shards ")]
    assert [c.name for c in cases] == ["shards node 0 (localhost)", "shards node 1 (localhost)"]
    assert all(c.is_passed for c in cases)


def test_a_damaged_checkpoint_fails_with_exit_1_and_names_the_shard(tmp_path: Path, checkpoint: Path) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    shard = damaged / "model-00002-of-00004.safetensors"
    with shard.open("r+b") as f:
        f.truncate(shard.stat().st_size - 4096)
    done = cli("validate", str(local_topology(tmp_path, damaged)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stdout and "shard 00002: 4,096 bytes short" in done.stdout


def test_input_errors_exit_2_and_unknown_deployments_5(tmp_path: Path, checkpoint: Path) -> None:
    from k3deploy.validate.stage import STAGE_NAMES
    from k3deploy.validate.stages import IMPLEMENTED

    topo = local_topology(tmp_path, checkpoint)
    lacking = [(["--only", n], f"stage {n}: not implemented in this version") for n in STAGE_NAMES
               if n not in IMPLEMENTED][:1]
    for args, text in [*lacking, (["--skip", "shardz"], "did you mean shards?"),
                       (["--manifest", str(tmp_path / "none.json")], "cannot read manifest")]:
        done = cli("validate", str(topo), *args)
        assert done.returncode == 2 and text in done.stderr, done.stderr
    done = cli("validate", "no-such-deployment", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 5 and "no deployment named no-such-deployment" in done.stderr


def test_validate_and_manifest_do_not_import_torch_ray_or_the_hub(tmp_path: Path, checkpoint: Path) -> None:
    heavy = ["torch", "ray", "paramiko", "huggingface_hub", "junitparser", "numpy"]
    assert imported_by(["validate", "--help"], heavy) == []
    assert imported_by(["validate", str(local_topology(tmp_path, checkpoint))], heavy) == []
    assert imported_by(["manifest", "create", "--help"], heavy) == []


def test_progress_lines_stream_back_through_the_fleet(tmp_path: Path, checkpoint: Path) -> None:
    from k3deploy.validate.nodes import fleet_runner
    from k3deploy.validate.run import resolve_target, validate
    from k3deploy.validate.stage import ProgressEvent

    events: list[ProgressEvent] = []
    report = validate(resolve_target(str(local_topology(tmp_path, checkpoint))), fleet_runner,
                      progress=events.append)
    assert report.passed, report.stages[0].detail
    assert {e.rank for e in events} == {0, 1}  # every node's probe reported progress before its result
    size = sum(f.stat().st_size for f in checkpoint.iterdir() if f.name != "k3-manifest.json")
    last = {e.rank: e for e in events}
    assert all((e.done, e.total, e.host) == (size, size, "localhost") for e in last.values())
