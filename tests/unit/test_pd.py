"""Prefill/decode roles: the topology's checks (located exit-2 errors at load), the plan of each role and the
cross-role rules the engines enforce (`render` of every instance and the router: test_pd_render.py)."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.flag_tables import flag_table
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import TopologyError, load_topology, parse_topology
from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"
SGLANG = ROOT / "topologies" / "pd-h200-1p1d-sglang.yaml"
VLLM = ROOT / "topologies" / "pd-h200-1p1d-vllm.yaml"


def _doc(path: Path = LOCAL) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc


def _load(doc: dict[str, Any]) -> Any:
    return parse_topology(yaml.safe_dump(copy.deepcopy(doc), sort_keys=False), "p.yaml")


def _codes(doc: dict[str, Any]) -> dict[str, str]:
    """code -> `path: message` of every load-time error (none of them leaves a partial topology)."""
    with pytest.raises(TopologyError) as exc:
        _load(doc)
    assert exc.value.partial is None
    assert all(i.line is not None for i in exc.value.issues)  # located
    return {i.code: f"{i.path}: {i.message}" for i in exc.value.issues}


def _plan(doc: dict[str, Any]) -> Plan:
    return make_plan(_load(doc), load_catalog())


def _plan_codes(doc: dict[str, Any]) -> dict[str, str]:
    return {i.code: f"{i.path}: {i.message} ({i.hint})" for i in _plan(doc).issues if i.severity != "info"}


def _vllm_local() -> dict[str, Any]:
    doc = _doc()
    doc["engine"]["mimic"] = "vllm"
    doc["router"]["kind"] = "vllm-router"
    doc["roles"]["transfer"] = {"backend": "nixl", "side_channel_port": 15600}
    return doc


# SGLang's decode pool on H200: what the engine holds beside the weights leaves 125,294 KV tokens, short of 8
# requests at 32,768 (test_sglang_state_pool.py pins that memory against the published admission caps).
@pytest.mark.parametrize(("path", "warnings"), [(LOCAL, []), (SGLANG, ["CONTEXT_AT_CONCURRENCY"] * 2), (VLLM, [])])
def test_pd_topologies_plan_clean(path: Path, warnings: list[str]) -> None:
    plan = make_plan(load_topology(path), load_catalog())
    assert plan.feasible and plan.pd is not None
    assert [i.code for i in plan.issues if i.severity != "info"] == warnings
    assert plan.pd.prefill.plan.shape is not None and plan.pd.decode.plan.shape is not None


def test_each_role_is_planned_with_its_own_shape() -> None:
    plan = make_plan(load_topology(SGLANG), load_catalog())
    assert plan.pd is not None
    pre, dec = plan.pd.prefill.plan, plan.pd.decode.plan
    assert pre.shape is not None and dec.shape is not None and pre.memory and dec.memory
    assert (pre.shape.dp, pre.shape.attn_tp) == (1, 16) and (dec.shape.dp, dec.shape.attn_tp) == (2, 8)
    # DP attention holds the non-expert weights once per 8 GPUs on decode, once per 16 on prefill.
    assert dec.memory.non_expert_weights_bytes == 2 * pre.memory.non_expert_weights_bytes
    doc = json.loads(run_k3deploy("plan", "--json", str(SGLANG)).stdout)
    roles = doc["roles"] if "roles" in doc else doc["files"][0]["roles"]
    assert roles["backend"] == "mooncake" and roles["pool"]["gpus"] == 32
    assert roles["pool"]["decode_kv_tokens"] == dec.capacity.kv_tokens if dec.capacity else False


def test_a_role_that_does_not_fit_is_named() -> None:
    doc = _doc(SGLANG)
    doc["roles"]["decode"]["parallel"]["dp"] = 16
    codes = _plan_codes(doc)
    assert codes["MEM_WEIGHTS"].startswith("roles.decode.parallel: decode: weights")


@pytest.mark.parametrize(("change", "code", "where"), [
    (lambda d: d["roles"]["prefill"].update(instances=3), "PD_NODE_COUNT", "roles.prefill.nodes"),
    (lambda d: d["roles"]["decode"]["nodes"].__setitem__(1, "10.9.9.9"), "PD_NODES", "roles.decode.nodes[1]"),
    (lambda d: d["roles"]["decode"]["nodes"].__setitem__(0, "127.0.0.1"), "PD_NODES", "roles.decode.nodes[0]"),
    (lambda d: d["roles"]["decode"]["nodes"].pop(), "PD_NODES", "roles"),
    (lambda d: d.pop("router"), "PD_ROUTER", "roles"),
    (lambda d: d.update(replicas=2), "PD_REPLICAS", "replicas"),
    (lambda d: d["nodes"][0].update(rank=0), "PD_RANK", "nodes[0].rank"),
    (lambda d: d["engine"].update(kind="vllm-ascend"), "PD_ENGINE", "roles"),
    (lambda d: d["roles"]["transfer"].update(bootstrap_port=18001), "PD_PORTS", "roles.transfer.bootstrap_port"),
    (lambda d: d["router"].update(port=18998), "PD_PORTS", "router.port"),
    (lambda d: d["router"].update(metrics_port=18001), "PD_PORTS", "router.metrics_port"),
    (lambda d: d["router"].update(port=18997), "PD_PORTS", "router.port"),  # its metrics port 18998: bootstrap's
])
def test_layout_mistakes_are_located_load_errors(change: Any, code: str, where: str) -> None:
    doc = _doc()
    if code == "PD_ENGINE":
        doc["engine"] = {"kind": "vllm-ascend", "port": 18000}
        doc["router"]["kind"] = "vllm-router"
    else:
        change(doc)
    codes = _codes(doc)
    assert code in codes and codes[code].startswith(f"{where}:"), codes


def test_backend_not_available_for_the_engine() -> None:
    doc = _vllm_local()
    doc["roles"]["transfer"]["backend"] = "mooncake"
    assert _codes(doc)["PD_BACKEND"] == "roles.transfer.backend: vllm cannot move the cache with mooncake"


def test_side_channel_ports_of_vllm_instances_collide_with_rendezvous() -> None:
    doc = _vllm_local()
    doc["roles"]["transfer"]["side_channel_port"] = 29499  # 29499-29502 runs into launch.port 29500
    assert "PD_PORTS" in _codes(doc)


def test_hybrid_model_needs_equal_tp_over_nixl() -> None:
    doc = _vllm_local()
    assert "PD_NIXL_TP" not in _plan_codes(doc)
    doc["roles"]["decode"]["parallel"] = {"tp": 1, "ep": 2, "dp": 2}
    codes = _plan_codes(doc)
    assert codes["PD_NIXL_TP"].startswith("roles.decode.parallel.tp: prefill TP 2 != decode TP 1")
    assert "vllm#50765" in codes["PD_NIXL_TP"]
    plan = _plan(doc)
    assert plan.valid and not plan.feasible  # a shape the engine refuses: exit 1


@pytest.mark.parametrize("flag", ["--disaggregation-bootstrap-port", "--disaggregation-mode",
                                  "--disaggregation-transfer-backend"])
def test_role_flags_in_engine_args_are_refused(flag: str) -> None:
    doc = _doc()
    doc["engine"]["args"] = {flag: "prefill" if flag.endswith("mode") else ("nixl" if "backend" in flag else 9000)}
    codes = _plan_codes(doc)
    assert codes["PD_OWNED_FLAG"].startswith(f"engine.args.{flag}:")
    assert "the decode cannot reach the prefill's bootstrap server" in codes["PD_OWNED_FLAG"]
    assert not _plan(doc).valid  # a mistake in the file: exit 2


@pytest.mark.parametrize("flag", ["--disaggregation-decode-tp", "--disaggregation-decode-dp"])
def test_sglang_decode_layout_flags_are_refused_with_the_reason(flag: str) -> None:
    doc = _doc()
    doc["engine"]["args"] = {flag: 2}
    assert "SGLang 0.5.23 has no such flag: decode fetches prefill's layout from its bootstrap server (GET /route" \
        in _plan_codes(doc)["PD_DECODE_LAYOUT_FLAG"]
    assert flag_table("sglang").get(flag) is None  # the rule's premise, from the real parser's table


def test_sglang_decode_pp_is_prefills_or_one() -> None:
    doc = _doc()
    doc["roles"]["prefill"]["parallel"] = {"tp": 1, "pp": 2}
    doc["roles"]["decode"]["parallel"] = {"tp": 1, "pp": 2}
    assert "PD_SGLANG_PP" not in _plan_codes(doc)  # equal
    doc["roles"]["decode"]["parallel"] = {"tp": 2, "ep": 2}
    assert "PD_SGLANG_PP" not in _plan_codes(doc)  # decode pp 1 pulls from every prefill stage
    doc["roles"]["prefill"]["parallel"] = {"tp": 2, "ep": 2}
    doc["roles"]["decode"]["parallel"] = {"tp": 1, "pp": 2}
    codes = _plan_codes(doc)
    assert codes["PD_SGLANG_PP"].startswith("roles.decode.parallel.pp: decode pp 2, prefill pp 1: SGLang's decode "
                                            "asserts") and "common/conn.py:1516" in codes["PD_SGLANG_PP"]
    assert not _plan(doc).feasible  # an illegal shape (exit 1), like PD_NIXL_TP


def test_sglang_different_attn_tp_warns_for_the_kda_state_and_is_refused_where_sglang_refuses() -> None:
    doc = _doc()
    assert not {"PD_STATE_RESLICE", "PD_SGLANG_SAME_TP", "PD_SGLANG_ATTN_TP"} & {i.code for i in _plan(doc).issues}
    doc["roles"]["decode"]["parallel"] = {"tp": 2, "ep": 2, "dp": 2, "attention_dp": True}  # attn TP 1 vs 2
    notes = {i.code: f"{i.path}: {i.message}" for i in _plan(doc).issues}
    assert notes["PD_STATE_RESLICE"].startswith("roles.decode.parallel.tp: prefill attn TP 2 != decode attn TP 1")
    assert "PD_SGLANG_SAME_TP" not in notes and all(i.severity != "error" or not i.code.startswith("PD_")
                                                   for i in _plan(doc).issues)  # SGLang reslices it: allowed
    for flag, where in (("--enable-kv-cache-sharding", "common/conn.py:1444"),
                        ("--enable-unified-memory", "mooncake/conn.py:1301")):
        doc["engine"]["args"] = {flag: True}
        got = _plan_codes(doc)["PD_SGLANG_SAME_TP"]
        assert got.startswith(f"roles.decode.parallel.tp: prefill attn TP 2 != decode attn TP 1 with {flag}") and where in got
        assert flag_table("sglang").get(flag) is not None  # a flag the pinned parser has


def test_sglang_decode_dcp_refuses_a_sharded_prefill_kv() -> None:
    doc = _doc()
    doc["roles"]["decode"]["parallel"] = {"tp": 2, "ep": 2, "dcp": 2}
    assert "PD_SGLANG_DCP" not in _plan_codes(doc)  # K3's KV pool is hybrid MLA: decode DCP is allowed
    doc["engine"]["args"] = {"--enable-kv-cache-sharding": True}
    got = _plan_codes(doc)["PD_SGLANG_DCP"]
    assert got.startswith("roles.decode.parallel.dcp: decode dcp 2 with --enable-kv-cache-sharding") and "1421" in got


def test_sglang_attn_tp_ratio_must_be_whole() -> None:
    doc = _doc()
    doc["hardware"]["gpus_per_node"] = 3
    doc["roles"]["prefill"]["parallel"] = {"tp": 6, "dp": 2, "attention_dp": True}  # attn TP 3
    doc["roles"]["decode"]["parallel"] = {"tp": 6, "dp": 3, "attention_dp": True}  # attn TP 2
    assert _plan_codes(doc)["PD_SGLANG_ATTN_TP"].startswith(
        "roles.decode.parallel.tp: prefill attn TP 3 and decode attn TP 2: SGLang maps decode ranks")
    doc["roles"]["decode"]["parallel"] = {"tp": 6, "dp": 6, "attention_dp": True}  # attn TP 1: 3 / 1 is whole
    assert "PD_SGLANG_ATTN_TP" not in _plan_codes(doc)


@pytest.mark.parametrize("name", ["VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"])
def test_one_side_channel_value_for_every_node_is_refused(name: str) -> None:
    doc = _vllm_local()
    doc["engine"]["env"] = {name: "10.0.0.1"}
    codes = _plan_codes(doc)
    assert codes["PD_SIDE_CHANNEL_ENV"].startswith(f"engine.env.{name}:") and "vllm#27083" in codes["PD_SIDE_CHANNEL_ENV"]


def test_pipelined_prefill_warns_of_the_ttft_floor() -> None:
    doc = _doc()
    assert "PD_PREFILL_PP" not in _plan_codes(doc)
    doc["roles"]["prefill"]["parallel"] = {"tp": 1, "pp": 2}
    assert "sglang#34815" in _plan_codes(doc)["PD_PREFILL_PP"]


def test_a_layout_mistake_beside_a_schema_error_is_reported_not_planned() -> None:
    doc = _doc()
    doc["roles"]["decode"]["nodes"][1] = "10.9.9.9"
    doc["serving"]["context_length"] = -1  # a schema error: the rest would be planned as a partial topology
    codes = _codes(doc)  # no partial: nothing plans roles whose nodes do not exist (was IndexError, exit 70)
    assert {"PD_NODES", "SCHEMA"} <= set(codes)
