"""Legality rules beyond the reference numbers: ranks, addresses, world size, engine rules."""
from __future__ import annotations

import pytest

from tests.unit.plan_helpers import codes, plan_of, topology_dict

pytestmark = pytest.mark.timeout(30)


def _with_nodes(nodes: list[dict], **kw: object) -> dict:
    doc = topology_dict(**kw)  # type: ignore[arg-type]
    doc["nodes"] = nodes
    return doc


def _n(i: int, **kw: object) -> dict:
    return {"host": f"n{i}", "ip": f"10.0.0.{10 + i}", "iface": "ens-priv", **kw}


def test_world_size_mismatch_names_the_arithmetic() -> None:
    plan = plan_of(topology_dict(nodes=3))
    issue = next(i for i in plan.issues if i.code == "WORLD_SIZE")
    assert "3 nodes x 8 GPUs = 24, but the engine's world size tp x pp = 32" in issue.message
    assert issue.hint == "use 4 nodes or change the shape" and issue.line is not None


def test_vllm_world_size_includes_dp() -> None:
    plan = plan_of(topology_dict(kind="vllm", gpu="b200", nodes=2, tp=8, ep=16, dp=2))
    assert plan.feasible and plan.shape is not None and plan.shape.world_size == 16
    assert "EP_VLLM" in codes(plan_of(topology_dict(kind="vllm", gpu="b200", nodes=2, tp=8, ep=8, dp=2)))


def test_sglang_attention_dp() -> None:
    doc = topology_dict(dp=4)
    assert "SGLANG_DP_REPLICAS" in codes(plan_of(doc))
    doc["parallel"]["attention_dp"] = True
    plan = plan_of(doc)
    assert plan.shape is not None and plan.shape.attn_tp == 8 and plan.shape.world_size == 32
    assert plan.memory is not None and plan.memory.kda_state_bytes_per_slot == 56_171_520


def test_dcp_must_divide_attention_tp() -> None:
    assert "DCP_ATTN_TP" in codes(plan_of(topology_dict(dcp=3)))


def test_pp_cannot_exceed_layers() -> None:
    assert "PP_LAYERS" in codes(plan_of(topology_dict(tp=1, ep=1, pp=128, nodes=16)))


def test_ranks_partial_duplicate_gap() -> None:
    assert "RANKS_PARTIAL" in codes(plan_of(_with_nodes([_n(0, rank=0), _n(1), _n(2), _n(3)])))
    assert "RANKS_DUPLICATE" in codes(plan_of(_with_nodes([_n(0, rank=0), _n(1, rank=1), _n(2, rank=1), _n(3, rank=2)])))
    assert "RANKS_GAP" in codes(plan_of(_with_nodes([_n(0, rank=0), _n(1, rank=1), _n(2, rank=2), _n(3, rank=5)])))
    plan = plan_of(_with_nodes([_n(0, rank=3), _n(1, rank=2), _n(2, rank=1), _n(3, rank=0)]))
    assert plan.feasible and plan.topology.ordered_nodes()[0][1].host == "n3"


def test_loopback_rendezvous_refused_except_local() -> None:
    doc = _with_nodes([{"host": "a", "ip": "127.0.0.1", "iface": "lo"}] + [_n(i) for i in range(1, 4)])
    plan = plan_of(doc)
    issue = next(i for i in plan.issues if i.code == "IP_LOOPBACK")
    assert "rendezvous address" in issue.message and issue.path == "nodes[0].ip"
    doc["launch"] = {"executor": "local"}
    assert "IP_LOOPBACK" not in codes(plan_of(doc))


def test_duplicate_ip_and_unspecified() -> None:
    assert "DUPLICATE_IP" in codes(plan_of(_with_nodes([_n(0), _n(1), _n(2), {**_n(3), "ip": "10.0.0.10"}])))
    assert "IP_UNSPECIFIED" in codes(plan_of(_with_nodes([{**_n(0), "ip": "0.0.0.0"}, _n(1), _n(2), _n(3)])))


def test_ascend_pairings() -> None:
    assert "ASCEND_NEEDS_W4A8" in codes(plan_of(topology_dict(kind="vllm-ascend", gpu="ascend-a3", per_node=16,
                                                              tp=16, ep=64, dp=4)))
    assert "QUANT_ASCEND" in codes(plan_of(topology_dict(kind="vllm", gpu="h200", nodes=4, model="kimi-k3-w4a8")))
    assert "ENGINE_HARDWARE" in codes(plan_of(topology_dict(kind="vllm-ascend", model="kimi-k3-w4a8")))


def test_unpinned_revision_warns() -> None:
    doc = topology_dict()
    del doc["model"]["revision"]
    plan = plan_of(doc)
    assert plan.feasible and any(i.code == "REVISION_UNPINNED" and i.severity == "warning" for i in plan.issues)


def test_context_longer_than_kv_pool_is_infeasible() -> None:
    plan = plan_of(topology_dict(context_length=100_000_000))
    issue = next(i for i in plan.issues if i.code == "MEM_KV_CONTEXT")
    assert "short by" in issue.message and issue.path == "serving.context_length"


def test_mem_fraction_too_high_warns_about_runtime() -> None:
    plan = plan_of(topology_dict(mem_fraction=0.95))
    assert any(i.code == "MEM_RUNTIME" for i in plan.issues)
