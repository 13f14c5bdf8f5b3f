"""`k3deploy render` as users run it: formats, --node, --out, exit codes, warnings, no heavy imports."""
from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli_imports import imported_by
from tests.unit.test_render_support import ROOT, doc_of

pytestmark = pytest.mark.timeout(60)
H100 = ROOT / "topologies" / "h100-4x8-sglang.yaml"
GOLDEN = ROOT / "tests" / "golden"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def k3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run the CLI in-process, as the console script does (exit code, stdout, stderr)."""
    from k3deploy.cli import app
    from k3deploy.cli.common import run_app

    def run(*args: str | Path) -> Result:
        monkeypatch.chdir(ROOT)
        monkeypatch.setattr(sys, "argv", ["k3deploy", *map(str, args)])
        code = run_app(app)
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


def write(tmp: Path, doc: dict[str, Any], name: str = "t.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("fmt", ["text", "json", "script", "slurm", "lws"])
def test_stdout_matches_golden(k3: Callable[..., Result], fmt: str) -> None:
    r = k3("render", H100, "--format", fmt)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (GOLDEN / "h100-4x8-sglang" / f"{fmt}.txt").read_text()


def test_json_contract_and_node_filter(k3: Callable[..., Result]) -> None:
    r = k3("render", H100, "--format", "json", "--node", "2")
    doc = json.loads(r.stdout)
    (node,) = doc["nodes"]
    assert set(node) >= {"rank", "host", "ip", "head", "argv", "env", "ready"}
    assert node["rank"] == 2 and node["host"] == "gpu-c" and node["head"] is False
    assert "HF_TOKEN" not in node["env"] and node["ready"]["kind"] == "dummy-health"
    assert [(s["name"], s["ref"]) for s in node["secrets"]] == [("HF_TOKEN", "env:HF_TOKEN")]
    assert node["argv"][node["argv"].index("--node-rank") + 1] == "2"


def test_out_writes_executable_scripts(k3: Callable[..., Result], tmp_path: Path) -> None:
    r = k3("render", H100, "--format", "script", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    files = sorted((tmp_path / "o").iterdir())
    assert [f.name for f in files] == [f"node-{i}.sh" for i in range(4)]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o755 for f in files)
    assert r.stdout.split() == [str(f) for f in files]
    for fmt, name in (("slurm", "k3deploy.sbatch"), ("lws", "lws.yaml"), ("json", "nodes.json")):
        assert k3("render", H100, "--format", fmt, "--out", tmp_path / "o").returncode == 0
        assert (tmp_path / "o" / name).exists()


def test_script_stdout_separates_nodes_with_a_header(k3: Callable[..., Result]) -> None:
    out = k3("render", H100, "--format", "script").stdout
    assert [line for line in out.splitlines() if line.startswith("# =====")] == \
        [f"# ===== node-{i}.sh =====" for i in range(4)]


@pytest.mark.parametrize("args,code,needle", [
    (["--format", "yaml"], 2, "--format yaml"),
    (["--node", "7"], 2, "--node 7: no such rank"),
    (["--format", "slurm", "--node", "1"], 2, "--node applies to"),
])
def test_bad_options_exit_2(k3: Callable[..., Result], args: list[str], code: int, needle: str) -> None:
    r = k3("render", H100, *args)
    assert r.returncode == code and needle in r.stderr and "Traceback" not in r.stderr


def test_infeasible_exit_1_and_invalid_exit_2(k3: Callable[..., Result], tmp_path: Path) -> None:
    bad = write(tmp_path, doc_of("h100-4x8-sglang", **{"engine.args": {"--moe-runner-backend": "auto"}}))
    r = k3("render", bad)
    assert r.returncode == 1 and "SGLANG_HOPPER_MOE_AUTO" not in r.stdout and "silently upcasts" in r.stderr
    assert r.stdout == ""
    invalid = write(tmp_path, doc_of("h100-4x8-sglang", **{"engine.kind": "sglng"}), "invalid.yaml")
    assert k3("render", invalid).returncode == 2


def test_warnings_go_to_stderr_without_secret_values(k3: Callable[..., Result], tmp_path: Path) -> None:
    fake = "hf_" + "Qw3" * 10
    doc = doc_of("h100-4x8-sglang", **{"engine.image": "lmsysorg/sglang:v0.5.23",
                                       "engine.env": {"HF_TOKEN": fake}})
    doc["engine"].pop("secrets")
    r = k3("render", write(tmp_path, doc), "--format", "text")
    assert r.returncode == 0
    assert "IMAGE_NOT_PINNED" in r.stderr and "ENV_LOOKS_SECRET" in r.stderr
    assert fake not in r.stdout + r.stderr and "HF_TOKEN=<redacted>" in r.stdout
    assert "-e HF_TOKEN " in r.stdout  # docker copies it from the node's environment


def test_render_imports_no_heavy_modules() -> None:
    assert imported_by(["render", str(H100), "--format", "lws"], ["torch", "ray", "paramiko", "numpy"]) == []
