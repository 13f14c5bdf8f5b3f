"""`k3deploy plan` as users run it: exit codes, --json contract, --check annotations, --search."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_imports import imported_by
from tests.k3deploy_cli import run_k3deploy
from tests.unit.plan_helpers import codes, plan_of, topology_dict

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
INVALID = ROOT / "tests" / "assets" / "invalid"


def k3(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_k3deploy(*args, timeout_s=60, env={"COLUMNS": "250"})


def test_every_shipped_topology_is_feasible() -> None:
    assert len(TOPOLOGIES) >= 10
    r = k3("plan", "--check", *TOPOLOGIES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("\nok ") + r.stdout.startswith("ok ") == len(TOPOLOGIES)


def test_plan_json_reproduces_reference_numbers() -> None:
    r = k3("plan", "--json", ROOT / "topologies" / "h100-4x8-sglang.yaml")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # Seed 000's command (SGLang's own pool ratio, no cap): the state pool admits 47, the cookbook reports ~49
    assert doc["feasible"] is True and [i["code"] for i in doc["issues"]] == ["CONTEXT_AT_CONCURRENCY"]
    assert doc["capacity"]["max_running_requests"] == 47 and doc["memory_per_gpu"]["pool_ratio"] == 0.9
    # Seed 000's reported per-GPU split ("The memory budget"), each line within 10%: SGLang's free share after the
    # pools is the cookbook's "free headroom" (the runtime reserve comes out of it), what else the engine holds is
    # its 16.4 GiB "framework overhead, activations, communication buffers" (usable less the listed lines): the
    # calibrated static memory and the vision tower SGLang keeps whole on every rank beyond the non-expert line.
    mem, gib = doc["memory_per_gpu"], 2**30
    ours = {"weights": mem["weights_bytes"], "mla_kv_cache": mem["kv_pool_bytes"],
            "kda_recurrent_state": mem["state_pool_bytes"], "free_headroom": mem["reserve_bytes"] + mem["headroom_bytes"],
            "unaccounted": mem["engine_static_bytes"] + mem["vision_bytes"]}
    seed = {"weights": 45.43, "mla_kv_cache": 3.62, "kda_recurrent_state": 3.40, "free_headroom": 10.34,
            "unaccounted": 16.4}
    assert {k: abs(ours[k] / gib / v - 1) <= 0.10 for k, v in seed.items()} == dict.fromkeys(seed, True), \
        {k: round(ours[k] / gib, 2) for k in seed}
    assert doc["shape"] | {} == doc["shape"] and {k: doc["shape"][k] for k in
                                                   ("tp", "ep", "dp", "pp", "dcp", "attn_tp", "world_size",
                                                    "nnodes", "experts_per_rank")} == {
        "tp": 32, "ep": 32, "dp": 1, "pp": 1, "dcp": 1, "attn_tp": 32, "world_size": 32, "nnodes": 4,
        "experts_per_rank": 28}
    mem = doc["memory_per_gpu"]
    assert round(mem["usable_bytes"] / 2**30, 2) == 79.19
    assert round(mem["weights_bytes"] / 2**30, 2) == 45.43
    assert mem["reserve_bytes"] == 8 * 2**30
    assert mem["vision_bytes"] == 802_000_000 - 802_000_000 // 32  # the tower less the non-expert line's / attn_tp 32
    assert sum(mem[k] for k in ("weights_bytes", "reserve_bytes", "engine_static_bytes", "vision_bytes",
                                "kv_pool_bytes", "state_pool_bytes", "headroom_bytes")) == mem["usable_bytes"]
    assert doc["per_token"]["mla_kv_bytes"] == 27648
    assert doc["per_request"]["kda_state_bytes"] == 14_042_880
    assert set(doc["capacity"]) >= {"kv_tokens", "max_running_requests", "max_context_tokens"}


@pytest.mark.parametrize(("gpu", "per_node", "nodes", "tp"), [
    ("h200", 8, 1, 8), ("b200", 8, 1, 8), ("gb200", 4, 2, 8), ("h100-80gb", 8, 2, 16)])
def test_too_small_pools_are_infeasible_with_memory_reason(gpu: str, per_node: int, nodes: int, tp: int,
                                                           tmp_path: Path) -> None:
    doc = topology_dict(gpu=gpu, per_node=per_node, nodes=nodes, tp=tp, ep=tp)
    assert "MEM_WEIGHTS" in codes(plan_of(doc))
    f = tmp_path / "small.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = k3("plan", "--json", f)
    assert r.returncode == 1
    issue = json.loads(r.stdout)["issues"][0]
    assert issue["code"] == "MEM_WEIGHTS" and "exceed usable" in issue["message"] and issue["line"]


def test_check_with_one_broken_file_exits_2_with_position(tmp_path: Path) -> None:
    r = k3("plan", "--check", *TOPOLOGIES, INVALID / "broken-port.yaml")
    assert r.returncode == 2
    assert f"::error file={INVALID / 'broken-port.yaml'},line=13,col=9,title=SCHEMA::" in r.stdout
    assert "invalid    " in r.stdout


def test_check_reports_all_five_mistakes() -> None:
    r = k3("plan", "--check", INVALID / "five-mistakes.yaml")
    assert r.returncode == 2
    assert r.stdout.count("::error ") == 5


def test_infeasible_exit_1_and_invalid_wins(tmp_path: Path) -> None:
    f = tmp_path / "tp48.yaml"
    f.write_text(yaml.safe_dump(topology_dict(tp=48, ep=48, nodes=6)))
    r = k3("plan", f)
    assert r.returncode == 1 and "does not divide hidden 7168 = 2^10 x 7" in r.stdout.replace("\n", " ")
    assert k3("plan", f, INVALID / "broken-port.yaml").returncode == 2


def test_unknown_catalog_id_is_invalid_input(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(yaml.safe_dump(topology_dict(gpu="h100")))
    r = k3("plan", "--json", f)
    assert r.returncode == 2
    assert json.loads(r.stdout)["issues"][0]["hint"].startswith("did you mean 'h100-80gb'")


def test_search_lists_legal_shapes_best_first() -> None:
    r = k3("plan", "--search", "--hardware", "h100-80gb", "--gpus", "32", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["hardware"] == "h100-80gb" and doc["gpus"] == 32 and doc["engine"] == "sglang"
    first = doc["shapes"][0]
    assert (first["tp"], first["pp"], first["feasible"]) == (32, 1, True)
    assert all(s["tp"] in (1, 2, 4, 8, 16, 32) for s in doc["shapes"])
    feas = [s["feasible"] for s in doc["shapes"]]
    assert feas == sorted(feas, reverse=True)
    r16 = json.loads(k3("plan", "--search", "--hardware", "h100-80gb", "--gpus", "16", "--json").stdout)
    assert not any(s["feasible"] for s in r16["shapes"])
    assert "exceed usable" in r16["shapes"][0]["reason"]


def test_bad_options_exit_2_without_traceback() -> None:
    r = k3("plan", "--search", "--gpus", "32")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--hardware" in r.stderr
    r = k3("plan", "/nonexistent.yaml")
    assert r.returncode == 2 and "cannot read" in r.stdout


@pytest.mark.parametrize(("argv", "says"), [
    (["nope"], "No such command 'nope'"),
    (["plan", "--bogus"], "No such option: --bogus"),
    (["plan", "--search", "--hardware", "h100-80gb", "--gpus", "many"], "Invalid value for '--gpus'"),
    (["launch"], "Missing argument"),
    ([], "Usage: k3deploy"),
])
def test_command_line_mistakes_are_usage_errors_exit_2(argv: list[str], says: str) -> None:
    r = k3(*argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stdout + r.stderr and "internal error" not in r.stderr and "Traceback" not in r.stderr


def test_schema_is_json_schema() -> None:
    r = k3("schema")
    doc = json.loads(r.stdout)
    assert doc["title"] == "k3deploy topology" and "nodes" in doc["properties"]
    assert doc["additionalProperties"] is False


@pytest.mark.parametrize("argv", [["plan", "topologies/h100-4x8-sglang.yaml"], ["--help"], ["plan", "--help"],
                                  ["explain", "--help"], ["explain", "tests/assets/failures/vllm-tp-heads.log"]])
def test_plan_and_help_import_no_heavy_modules(argv: list[str]) -> None:
    assert imported_by(argv, ["torch", "ray", "paramiko", "httpx"]) == []


@pytest.mark.parametrize("mode", ["--json", "--check"])
def test_machine_output_draws_no_tables(mode: str) -> None:
    assert imported_by(["plan", mode, "topologies/h100-4x8-sglang.yaml"], ["rich.console", "rich.table"]) == []


def test_file_names_are_printed_verbatim(tmp_path: Path) -> None:
    f = tmp_path / "[bold]site:smile:.yaml"
    f.write_text(yaml.safe_dump(topology_dict(gpu="h100")))
    r = k3("plan", f, INVALID / "broken-port.yaml")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.count("[bold]site:smile:.yaml") >= 2  # the heading and the issue's location


def test_console_script_installed() -> None:
    # Beside this interpreter: the venv is used as `.venv/bin/...`, never necessarily activated.
    exe = shutil.which("k3deploy", path=str(Path(sys.executable).parent))
    assert exe, "pip install -e . installs the k3deploy console script"


def test_search_on_ascend_lists_only_vllm_ascend_with_the_w4a8_model() -> None:
    """The pairing `plan FILE` applies: vLLM-Ascend and the W4A8 checkpoint by default; SGLang on NPUs exits 2."""
    r = k3("plan", "--search", "--hardware", "ascend-a3", "--gpus", "64", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["engine"], doc["model"]) == ("vllm-ascend", "kimi-k3-w4a8") and any(s["feasible"] for s in doc["shapes"])
    bad = k3("plan", "--search", "--hardware", "ascend-a3", "--gpus", "64", "--engine", "sglang")
    assert bad.returncode == 2 and "ENGINE_HARDWARE" in bad.stderr
