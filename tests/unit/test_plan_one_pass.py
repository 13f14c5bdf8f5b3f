"""One pass over a file's problems, exit codes that agree with the headings, and what a plan warns about."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.files import plan_path
from k3deploy.planning.search import search_shapes
from k3deploy.topology.loader import TopologyError, parse_topology
from tests.k3deploy_cli import run_k3deploy
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "topologies" / "h100-4x8-sglang.yaml"

# A misspelled key, tp: 48, an unknown GPU, a duplicate IP and a bad port: five mistakes, one run.
FIVE = """\
name: mix
model: {id: kimi-k3, path: /models/Kimi-K3, revison: abc}
hardware: {gpu: h100-80gbb, gpus_per_node: 8}
nodes:
  - {host: gpu-a, ip: 10.0.0.10, iface: ens-priv}
  - {host: gpu-b, ip: 10.0.0.10, iface: ens-priv}
  - {host: gpu-c, ip: 10.0.0.12, iface: ens-priv}
  - {host: gpu-d, ip: 10.0.0.13, iface: ens-priv}
  - {host: gpu-e, ip: 10.0.0.14, iface: ens-priv}
  - {host: gpu-f, ip: 10.0.0.15, iface: ens-priv}
engine: {kind: sglang, port: 99999}
parallel: {tp: 48, ep: 48}
"""


def k3(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_k3deploy(*args, timeout_s=60, env={"COLUMNS": "200"})


def write(tmp: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def test_schema_catalog_and_legality_problems_come_in_one_pass(tmp_path: Path) -> None:
    f = write(tmp_path, FIVE)
    result = plan_path(f, load_catalog())
    where = {(i.code, i.path) for i in result.issues if i.severity == "error"}
    assert {("SCHEMA", "model.revison"), ("SCHEMA", "engine.port"), ("UNKNOWN_HARDWARE", "hardware.gpu"),
            ("DUPLICATE_IP", "nodes[0].ip"), ("TP_HIDDEN", "parallel.tp")} <= where, where
    assert result.exit_code == 2
    # What could not be checked yet is said, not silently skipped.
    unchecked = [i for i in result.issues if i.code == "NOT_CHECKED"]
    assert unchecked and any("memory" in i.message and "hardware.gpu" in i.message for i in unchecked)
    r = k3("plan", "--json", f)
    assert r.returncode == 2
    codes = [i["code"] for i in json.loads(r.stdout)["issues"]]
    assert {"SCHEMA", "UNKNOWN_HARDWARE", "DUPLICATE_IP", "TP_HIDDEN"} <= set(codes)
    check = k3("plan", "--check", f)
    assert "checks waiting for a fix" in check.stdout and "title=NOT_CHECKED::" in check.stdout
    assert check.stdout.count("::error ") == 7 and "::notice file=" in check.stdout


def test_a_value_left_out_by_a_schema_error_blocks_only_the_checks_that_read_it(tmp_path: Path) -> None:
    doc = topology_dict()
    doc["serving"]["mem_fraction"] = 1.5
    doc["nodes"][1]["ip"] = doc["nodes"][0]["ip"]
    result = plan_path(write(tmp_path, yaml.safe_dump(doc, sort_keys=False)), load_catalog())
    codes = {i.code for i in result.issues}
    assert {"SCHEMA", "DUPLICATE_IP"} <= codes
    note = [i for i in result.issues if i.code == "NOT_CHECKED"]
    assert any("serving.mem_fraction" in i.message and "memory" in i.message for i in note), note
    assert not any(i.code.startswith("MEM_") for i in result.issues)  # never a budget from a guessed value


def test_an_unrepairable_file_says_later_checks_wait(tmp_path: Path) -> None:
    doc = topology_dict()
    doc["nodes"][2]["ip"] = "not-an-ip"
    result = plan_path(write(tmp_path, yaml.safe_dump(doc, sort_keys=False)), load_catalog())
    assert [i.code for i in result.issues] == ["SCHEMA", "NOT_CHECKED"]
    assert "catalog" in result.issues[1].message and result.issues[1].severity == "info"


def test_unknown_gpu_is_headed_invalid_and_exits_2(tmp_path: Path) -> None:
    f = write(tmp_path, yaml.safe_dump(topology_dict(gpu="h100-80gbb"), sort_keys=False))
    r = k3("plan", f)
    assert r.returncode == 2
    assert "INVALID" in r.stdout and "INFEASIBLE" not in r.stdout


@pytest.mark.parametrize("gpu", ["h100-80gb", "h100-80gbb"])
def test_duplicate_ip_always_exits_2(tmp_path: Path, gpu: str) -> None:
    doc = topology_dict(gpu=gpu)
    doc["nodes"][1]["ip"] = doc["nodes"][0]["ip"]
    r = k3("plan", write(tmp_path, yaml.safe_dump(doc, sort_keys=False)))
    assert r.returncode == 2, r.stdout
    assert "DUPLICATE_IP" in r.stdout and "INVALID" in r.stdout


def test_yaml_syntax_error_points_at_the_line_with_the_mistake() -> None:
    text = ("name: x\n"
            "model: {id: kimi-k3, path: /m\n"  # the '}' is missing here, on line 2
            "hardware: {gpu: h100-80gb, gpus_per_node: 8}\n")
    with pytest.raises(TopologyError) as exc:
        parse_topology(text, "y.yaml")
    issue = exc.value.issues[0]
    assert (issue.code, issue.line) == ("YAML", 2), issue
    assert "line 3" in issue.message  # where the parser noticed is still said


def test_illegal_tp_does_not_suggest_a_node_count() -> None:
    plan = plan_of(topology_dict(tp=48, ep=48, nodes=4))
    world = [i for i in plan.issues if i.code == "WORLD_SIZE"]
    assert {"TP_HIDDEN", "TP_VOCAB"} <= {i.code for i in plan.issues}
    assert world and "6 nodes" not in (world[0].hint or "") and "search" in (world[0].hint or "")


def test_headroom_means_the_same_in_plan_and_search() -> None:
    cat = load_catalog()
    plan = plan_path(H100, cat).plan
    assert plan is not None and plan.memory is not None
    rows = search_shapes(cat, model_id="kimi-k3", hardware_id="h100-80gb", gpus=32, family="sglang")
    row = next(r for r in rows if (r.tp, r.ep, r.dp, r.pp) == (32, 32, 1, 1))
    assert row.headroom_bytes == plan.memory.headroom_bytes
    assert row.cache_bytes == plan.memory.kv_pool_bytes + plan.memory.state_pool_bytes


def test_feasible_plan_warns_when_the_context_cannot_all_fit_at_that_concurrency() -> None:
    plan = plan_path(H100, load_catalog()).plan
    assert plan is not None and plan.feasible and plan.capacity is not None
    warn = [i for i in plan.issues if i.code == "CONTEXT_AT_CONCURRENCY"]
    assert warn and warn[0].severity == "warning"
    assert "2,848" in warn[0].message and "131,072" in warn[0].message and "at 47 concurrent" in warn[0].message
    assert warn[0].hint is not None and "max_running_requests" in warn[0].hint
    roomy = plan_of(topology_dict(max_running_requests=1))
    assert roomy.feasible and "CONTEXT_AT_CONCURRENCY" not in {i.code for i in roomy.issues}


def test_topology_error_is_an_input_error() -> None:
    from k3deploy.errors import InputError, K3Error

    err = TopologyError("t.yaml", [])
    assert isinstance(err, InputError) and isinstance(err, K3Error) and err.exit_code == 2
