"""Known-bad engine command lines are plan-time errors with the reason (never rendered)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.diagnostics import Issue
from k3deploy.errors import InfeasibleError
from k3deploy.planning.files import require_feasible
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import parse_topology

ROOT = Path(__file__).resolve().parents[2]
FAST = pytest.mark.timeout(30)


def doc_of(stem: str, **patch: Any) -> dict[str, Any]:
    """A documented topology with dotted-path overrides, e.g. {'engine.args': {...}}."""
    doc = yaml.safe_load((ROOT / "topologies" / f"{stem}.yaml").read_text())
    for dotted, value in patch.items():
        *parents, last = dotted.split(".")
        cur = doc
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[last] = value
    return doc


def plan_of(doc: dict[str, Any]) -> Plan:
    return make_plan(parse_topology(yaml.safe_dump(doc, sort_keys=False), "t.yaml"), load_catalog())


def line_of(doc: dict[str, Any], needle: str) -> int:
    """The 1-based line of the dumped YAML that holds `needle` (what plan_of parses)."""
    text = yaml.safe_dump(doc, sort_keys=False)
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def issue(plan: Plan, code: str) -> Issue:
    found = [i for i in plan.issues if i.code == code]
    assert found, f"no {code} in {[i.code for i in plan.issues]}"
    return found[0]


def errors(plan: Plan) -> set[str]:
    return {i.code for i in plan.issues if i.severity == "error"}


@FAST
@pytest.mark.parametrize("path", sorted((ROOT / "topologies").glob("*.yaml")), ids=lambda p: p.stem)
def test_documented_topologies_have_no_engine_issue(path: Path) -> None:
    plan = require_feasible(path, load_catalog())
    engine_codes = {"ENGINE_ARG_UNKNOWN", "ENGINE_ARG_VALUE", "SGLANG_DCP_BACKEND", "SGLANG_HOPPER_MOE_AUTO",
                    "VLLM_MIXED_MULTINODE", "QUANT_ASCEND_VANILLA", "RENDEZVOUS_ADDR"}
    assert not {i.code for i in plan.issues} & engine_codes


@FAST
def test_sglang_dcp_with_a_non_dcp_decode_backend() -> None:
    plan = plan_of(doc_of("b200-2x8-sglang", **{"engine.args": {"--decode-attention-backend": "flashmla"}}))
    i = issue(plan, "SGLANG_DCP_BACKEND")
    assert i.severity == "error" and i.path == "engine.args.--decode-attention-backend" and i.line
    assert "cutedsl_mla" in i.message and "aiter" in i.message and "not flashmla" in i.message


@FAST
def test_sglang_dcp_on_hopper_is_an_error_from_the_shape() -> None:
    plan = plan_of(doc_of("h100-4x8-sglang", **{"parallel.dcp": 2}))
    i = issue(plan, "SGLANG_DCP_BACKEND")
    assert i.path == "parallel.dcp" and "H100" in i.message and i.hint == "set parallel.dcp: 1"


@FAST
def test_sglang_dcp_falls_back_to_attention_backend_like_sglang() -> None:
    # --attention-backend alone does not replace the rendered --decode-attention-backend cutedsl_mla...
    ok = plan_of(doc_of("b200-2x8-sglang", **{"engine.args": {"--attention-backend": "trtllm_mla"}}))
    assert "SGLANG_DCP_BACKEND" not in errors(ok)
    # ...but with the decode flag dropped, SGLang decodes with --attention-backend.
    bad = plan_of(doc_of("b200-2x8-sglang", **{"engine.args": {"--attention-backend": "trtllm_mla",
                                                                "--decode-attention-backend": None}}))
    assert "not trtllm_mla" in issue(bad, "SGLANG_DCP_BACKEND").message


@FAST
def test_vllm_mixing_nnodes_with_per_node_dp_flags() -> None:
    plan = plan_of(doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--nnodes": 4}}))
    i = issue(plan, "VLLM_MIXED_MULTINODE")
    assert i.path == "engine.args.--nnodes" and "must be divisible" in i.message
    assert "ENGINE_ARG_MANAGED" not in errors(plan)


@FAST
def test_vllm_mixing_dp_flags_into_the_nnodes_form() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "engine.args": {"-dpl": 1}})
    i = issue(plan_of(doc), "VLLM_MIXED_MULTINODE")
    assert i.path == "engine.args.-dpl" and "--nnodes/--node-rank" in i.message


@FAST
def test_quantization_ascend_on_vanilla_vllm() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "engine.args": {"--quantization": "ascend"}})
    i = issue(plan_of(doc), "QUANT_ASCEND_VANILLA")
    assert "Unknown quantization method: ascend" in i.message and i.path == "engine.args.--quantization"


@FAST
def test_quantization_ascend_on_sglang_is_the_same_error_not_a_choice_error() -> None:
    plan = plan_of(doc_of("h100-4x8-sglang", **{"engine.args": {"--quantization": "ascend"}}))
    assert "QUANT_ASCEND_VANILLA" in errors(plan) and "ENGINE_ARG_VALUE" not in errors(plan)


@FAST
def test_sglang_auto_moe_backend_on_hopper() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.args": {"--moe-runner-backend": "auto"}})
    i = issue(plan_of(doc), "SGLANG_HOPPER_MOE_AUTO")
    assert i.severity == "error" and "BF16" in i.message and "79.19 GiB usable" in i.message
    assert i.path == "engine.args.--moe-runner-backend" and i.line == line_of(doc, "--moe-runner-backend")


@FAST
def test_auto_moe_backend_is_fine_on_blackwell() -> None:
    plan = plan_of(doc_of("b200-2x8-sglang", **{"engine.args": {"--moe-runner-backend": "auto"}}))
    assert "SGLANG_HOPPER_MOE_AUTO" not in errors(plan)


@FAST
@pytest.mark.parametrize("flag,value,why", [
    ("--dist-init-addr", "", "empty"),
    ("--dist-init-addr", "127.0.0.1:20000", "loopback"),
    ("--dist-init-addr", "10.0.0.10", "not IP:PORT"),
    ("--dist-init-addr", "head-node:20000", "not an IP address"),
    ("--dist-init-addr", "0.0.0.0:20000", "not an address other nodes can dial"),
])
def test_rendezvous_override_empty_or_loopback(flag: str, value: str, why: str) -> None:
    i = issue(plan_of(doc_of("h100-4x8-sglang", **{"engine.args": {flag: value}})), "RENDEZVOUS_ADDR")
    assert why in i.message and i.path == f"engine.args.{flag}"


@FAST
def test_rendezvous_override_on_vllm_master_addr() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "engine.args": {"--master-addr": "::1"}})
    assert "loopback" in issue(plan_of(doc), "RENDEZVOUS_ADDR").message


@FAST
def test_loopback_rank0_ip_is_a_plan_error() -> None:
    doc = doc_of("h100-4x8-sglang")
    doc["nodes"][0]["ip"] = "127.0.0.1"
    i = issue(plan_of(doc), "IP_LOOPBACK")
    assert i.severity == "error" and "rendezvous" in i.message


@FAST
def test_loopback_rendezvous_is_fine_for_the_local_executor() -> None:
    doc = doc_of("h100-4x8-sglang", **{"launch.executor": "local",
                                       "engine.args": {"--dist-init-addr": "127.0.0.1:20000"}})
    assert "RENDEZVOUS_ADDR" not in errors(plan_of(doc))


@FAST
def test_known_bad_plan_refuses_to_render_with_the_reason(tmp_path: Path) -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.args": {"--moe-runner-backend": "auto"}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(InfeasibleError) as exc:
        require_feasible(path, load_catalog())
    where = f"{path}:{line_of(doc, '--moe-runner-backend')}:"
    assert where in str(exc.value) and "silently upcasts" in str(exc.value)


@FAST
def test_unknown_flag_with_did_you_mean() -> None:
    i = issue(plan_of(doc_of("h100-4x8-sglang", **{"engine.args": {"--moe-runner-backnd": "marlin"}})),
              "ENGINE_ARG_UNKNOWN")
    assert i.hint == "did you mean '--moe-runner-backend'?" and "sglang 0.5.23" in i.message


@FAST
@pytest.mark.parametrize("stem,args,needle", [
    ("h100-4x8-sglang", {"--reasoning-parser": "kimi_k9"}, "choices"),
    ("h100-4x8-sglang", {"--context-length": "lots"}, "integer"),
    ("h100-4x8-sglang", {"--enable-metrics": "yes"}, "switch"),
    ("h100-4x8-sglang", {"--served-model-name": True}, "takes a value"),
])
def test_bad_values(stem: str, args: dict[str, Any], needle: str) -> None:
    assert needle in issue(plan_of(doc_of(stem, **{"engine.args": args})), "ENGINE_ARG_VALUE").message


@FAST
def test_vllm_parser_names_are_checked_against_its_registry() -> None:
    doc = doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--tool-call-parser": "kimi_k9"}})
    assert "choices" in issue(plan_of(doc), "ENGINE_ARG_VALUE").message
    doc = doc_of("ascend-a3-4x16-vllm", **{"engine.args": {"--tool-call-parser": "kimi_k2"}})
    assert "ENGINE_ARG_VALUE" not in errors(plan_of(doc))


@FAST
def test_human_readable_ints_are_accepted() -> None:
    plan = plan_of(doc_of("h100-4x8-sglang", **{"engine.args": {"--context-length": "128k"}}))
    assert "ENGINE_ARG_VALUE" not in errors(plan)


@FAST
@pytest.mark.parametrize("flag", ["--tp-size", "--node-rank", "--nnodes"])
def test_flags_rendered_from_the_topology_cannot_be_overridden(flag: str) -> None:
    i = issue(plan_of(doc_of("h100-4x8-sglang", **{"engine.args": {flag: 2}})), "ENGINE_ARG_MANAGED")
    assert i.path == f"engine.args.{flag}"


@FAST
def test_credentials_on_the_command_line_are_errors() -> None:
    plan = plan_of(doc_of("h100-4x8-sglang", **{"engine.args": {"--api-key": "not-a-real-key-123"}}))
    assert "/proc/PID/cmdline" in issue(plan, "ENGINE_ARG_SECRET").message


@FAST
def test_image_not_pinned_and_secret_looking_env_are_warnings() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.image": "lmsysorg/sglang:v0.5.23",
                                       "engine.env": {"WANDB_API_KEY": "xyz-fake"}})
    plan = plan_of(doc)
    assert issue(plan, "IMAGE_NOT_PINNED").severity == "warning"
    w = issue(plan, "ENV_LOOKS_SECRET")
    assert w.severity == "warning" and "engine.secrets" in (w.hint or "") and "xyz-fake" not in w.message
    assert plan.feasible
    pinned = plan_of(doc_of("h100-4x8-sglang", **{"engine.image": "lmsysorg/sglang@sha256:" + "ab" * 32}))
    assert "IMAGE_NOT_PINNED" not in {i.code for i in pinned.issues}


@FAST
def test_docker_cannot_mount_a_path_with_a_colon() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.image": "img@sha256:" + "ab" * 32,
                                       "model.path": "/models/a:b"})
    assert issue(plan_of(doc), "DOCKER_MODEL_PATH").path == "model.path"


@FAST
def test_empty_launcher_and_version_mismatch() -> None:
    plan = plan_of(doc_of("h100-4x8-sglang", **{"engine.launcher": [], "engine.version": "0.5.9"}))
    assert "LAUNCHER_EMPTY" in errors(plan)
    assert issue(plan, "ENGINE_VERSION").severity == "warning"


@FAST
def test_symm_mem_with_dcp_warns() -> None:
    plan = plan_of(doc_of("b200-2x8-sglang", **{"engine.args": {"--enable-symm-mem": True}}))
    assert issue(plan, "SGLANG_DCP_SYMM_MEM").severity == "warning"


@FAST
@pytest.mark.parametrize("kind,flag", [("sglang", "--model-path"), ("sglang", "--model"), ("vllm", "--model")])
def test_the_model_flag_is_rendered_from_model_path(kind: str, flag: str) -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.kind": kind, "engine.args": {flag: "/models/other"}})
    i = issue(plan_of(doc), "ENGINE_ARG_MANAGED")
    assert i.severity == "error" and i.path == f"engine.args.{flag}" and "model.path" in i.message
