"""Replicas and the router: the topology's checks (each a located error at load), the per-replica plan and
the pool, the router's settings sized from the plan (their rendering: test_replicas_render.py)."""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.router import router_argv
from k3deploy.planning.perf_model import prefill_latency_s
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.planning.pool import HEALTH_TIMEOUT_UNKNOWN_S
from k3deploy.planning.prediction import perf_inputs
from k3deploy.topology.loader import TopologyError, load_topology, parse_topology
from k3deploy.topology.replicas import replica_groups, replica_topology

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "tests" / "assets" / "replicas" / "local-2x2-smg.yaml"


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(LOCAL.read_text(encoding="utf-8"))
    return doc


def _text(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(copy.deepcopy(doc), sort_keys=False)


def _load(doc: dict[str, Any]) -> Any:
    return parse_topology(_text(doc), "r.yaml")


def _at(doc: dict[str, Any], key: str, value: str) -> str:
    """`r.yaml:L:C` of `value` on the first line holding `key: value` in the YAML text of `doc`."""
    for n, line in enumerate(_text(doc).splitlines(), 1):
        if f"{key}: {value}" in line:
            return f"r.yaml:{n}:{line.index(f'{key}: {value}') + len(key) + 3}"
    raise AssertionError(f"{key}: {value} not in the text")


def _errors(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(TopologyError) as exc:
        _load(doc)
    assert exc.value.partial is None  # nothing downstream plans inconsistent replicas
    return [f"{i.render('r.yaml')} [{i.code}]" for i in exc.value.issues]


def _plan(doc: dict[str, Any]) -> Plan:
    return make_plan(_load(doc), load_catalog())


def test_node_list_cut_in_order_each_replica_its_own_ports() -> None:
    t = load_topology(LOCAL).topology
    assert replica_groups(t) == [[0, 1], [2, 3]]
    r1 = replica_topology(t, 1)
    assert [n.ip for n in r1.nodes] == ["127.0.0.3", "127.0.0.4"]
    assert (r1.name, r1.engine.port, r1.launch.port, r1.replicas, r1.router) == ("k3-replicas-r1", 18001, 29501, 1,
                                                                                  None)


def test_replica_nodes_name_each_replica_by_host_or_ip() -> None:
    doc = _doc()
    doc["replica_nodes"] = [["127.0.0.4", "127.0.0.1"], ["127.0.0.2", "127.0.0.3"]]
    assert replica_groups(_load(doc).topology) == [[3, 0], [1, 2]]


def test_node_count_that_does_not_cut_is_located() -> None:
    doc = _doc()
    doc["replicas"] = 3
    lines = _errors(doc)
    assert lines == [(f"{_at(doc, 'replicas', '3')}: replicas: 4 nodes cannot be cut into 3 equal replicas (list 3 x N nodes, or "
                     "name each replica's nodes in replica_nodes) [REPLICA_NODE_COUNT]")], lines


def test_replica_node_groups_every_mistake_at_once() -> None:
    doc = _doc()
    doc["replica_nodes"] = [["127.0.0.1", "127.0.0.9"], ["127.0.0.1"]]
    text = "\n".join(_errors(doc))
    assert "replica_nodes: replicas of one shape need the same node count; groups have [2, 1]" in text
    assert "replica_nodes[0][1]: '127.0.0.9' is the host or ip of no node" in text
    assert "replica_nodes[1][0]: node '127.0.0.1' is in replica_nodes[0][0] already" in text
    assert "replica_nodes: node(s) 127.0.0.2, 127.0.0.3, 127.0.0.4 in no replica" in text
    doc["replica_nodes"] = [["localhost", "127.0.0.2"], ["127.0.0.3", "127.0.0.4"]]
    assert any("replica_nodes[0][0]: 'localhost' names 4 nodes (name the node by its ip)" in line
               for line in _errors(doc))


def test_router_kind_must_front_the_engine() -> None:
    doc = _doc()
    doc["router"]["kind"] = "vllm-router"
    lines = _errors(doc)
    assert lines == [(f"{_at(doc, 'kind', 'vllm-router')}: router.kind: router vllm-router cannot front the stand-in mimicking sglang "
                     "replicas (use smg or sglang-router) [ROUTER_ENGINE]")], lines
    doc["engine"]["mimic"] = "vllm"
    assert _load(doc).topology.router is not None  # vllm-router fronts vLLM replicas
    doc["router"]["kind"] = "smg"
    assert any("[ROUTER_ENGINE]" in line and "use vllm-router" in line for line in _errors(doc))


def test_port_collisions_are_located() -> None:
    doc = _doc()
    doc["router"]["port"] = 18001  # replica 1's API port, on this machine (local executor)
    assert _errors(doc) == [(f"{_at(doc, 'port', '18001')}: router.port: router port 18001 is a replica's port (engine.port + i: "
                            "18000-18001) on the same machine (pick another port) [ROUTER_PORT]")]
    doc = _doc()
    doc["launch"]["port"] = 18001  # replica 0 rendezvouses where replica 1 serves
    assert any("replicas: replicas serve on 18000-18001 (engine.port + i) and rendezvous on 18001-18002" in line
               for line in _errors(doc))
    doc = _doc()
    doc["router"]["metrics_port"] = 18000  # the router's exporter where replica 0 serves
    assert any("router.metrics_port: router metrics port 18000 is a replica's port" in line and "[ROUTER_PORT]" in line
               for line in _errors(doc))
    doc["router"]["metrics_port"] = 30000
    assert any("router metrics_port 30000 is the router's own port" in line for line in _errors(doc))
    doc = _doc()
    doc["engine"]["port"] = 65535
    assert any("replicas: 2 replicas need ports up to 65536, past 65535" in line for line in _errors(doc))


def test_router_metrics_port_defaults_past_its_port_and_collisions_are_located() -> None:
    doc = _doc()
    settings = _plan(doc).router
    assert settings is not None and settings.settings.prometheus_port == 30001  # not the routers' shared 29000
    argv = router_argv(settings.settings)
    assert argv[argv.index("--prometheus-port") + 1] == "30001" and argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    doc["router"]["metrics_port"] = 18001  # replica 1's API port, on this machine
    assert _errors(doc) == [(f"{_at(doc, 'metrics_port', '18001')}: router.metrics_port: router metrics port 18001 is "
                            "a replica's port (engine.port + i: 18000-18001) on the same machine (set "
                            "router.metrics_port to a free port) [ROUTER_PORT]")]
    doc["router"].pop("metrics_port")
    doc["router"]["port"] = 65535  # its default metrics port would be 65536
    assert any(line.startswith(f"{_at(doc, 'port', '65535')}: router.port: router metrics port 65536 (port + 1) is past "
                               "65535") for line in _errors(doc))
    doc["router"]["port"] = 29499  # its default metrics port, 29500, is replica 0's rendezvous port
    assert any(line.startswith(f"{_at(doc, 'port', '29499')}: router.port: router metrics port 29500 is a replica's "
                               "port (launch.port + i") for line in _errors(doc))


def test_router_on_a_node_collides_with_that_nodes_ports_and_must_name_one_node() -> None:
    doc = _doc()
    doc["launch"]["executor"] = "ssh"
    doc["nodes"] = [{"host": f"n{i}", "ip": f"10.0.0.{i + 1}", "iface": "eth1"} for i in range(4)]
    doc["router"]["port"] = 29501
    assert _load(doc).topology.router is not None  # on this host, remote nodes: no collision
    doc["router"]["runs_on"] = "n2"
    assert any("[ROUTER_PORT]" in line for line in _errors(doc))
    doc["router"] = {"kind": "smg", "runs_on": "n9"}
    assert any("router.runs_on: runs_on 'n9' names no node" in line for line in _errors(doc))


def test_explicit_ranks_are_refused_with_replicas() -> None:
    doc = _doc()
    for i, n in enumerate(doc["nodes"]):
        n["rank"] = i
    assert any("nodes[0].rank: with replicas, a node's rank is its place" in line for line in _errors(doc))


def test_plan_is_one_replica_plus_the_pool() -> None:
    single = _doc()
    for key in ("replicas", "router"):
        single.pop(key)
    single["nodes"] = single["nodes"][:2]
    one, both = _plan(single), _plan(_doc())
    assert one.feasible and both.feasible, [i.render("") for i in both.issues]
    assert both.shape == one.shape and both.capacity == one.capacity and both.memory == one.memory
    assert both.shape is not None and both.shape.nnodes == 2 and one.capacity is not None
    assert both.pool is not None and one.pool is None
    assert (both.pool.replicas, both.pool.gpus) == (2, 4)
    assert both.pool.kv_tokens == 2 * one.capacity.kv_tokens
    assert both.pool.max_running_requests == 2 * one.capacity.max_running_requests


def test_router_timeouts_sized_above_prefill_and_load() -> None:
    plan = _plan(_doc())
    assert plan.router is not None and plan.router.longest_prefill_s is not None
    s = plan.router.settings
    assert s.health_check_timeout_s > plan.router.longest_prefill_s
    assert s.startup_timeout_s > 120  # launch.ready_timeout_s
    assert s.worker_urls == ("http://127.0.0.1:18000", "http://127.0.0.3:18001")
    assert (s.policy, s.listen, s.port) == ("cache_aware", "127.0.0.1", 30000)


def test_router_health_timeout_is_the_perf_models_longest_prefill_times_the_catalog_margin() -> None:
    cat = load_catalog()
    plan = make_plan(_load(_doc()), cat)
    assert plan.router is not None
    inp = perf_inputs(plan, cat)
    prefill = prefill_latency_s(inp, 32768, inp.attn_groups)  # serving.context_length: the longest prompt
    assert plan.router.longest_prefill_s == pytest.approx(prefill)
    margin = cat.planner.router_health_margin
    assert plan.router.settings.health_check_timeout_s == max(30, math.ceil(margin * prefill))
    # The engine's own speed (K3SIM_SPEED) scales the prefill the model predicts, and so the timeout.
    doc = _doc()
    doc["engine"]["env"] = {"K3SIM_SPEED": "0.25"}
    slow = make_plan(_load(doc), cat).router
    assert slow is not None and slow.longest_prefill_s == pytest.approx(4 * prefill)
    assert slow.settings.health_check_timeout_s == math.ceil(margin * 4 * prefill)
    wider = cat.model_copy(update={"planner": cat.planner.model_copy(update={"router_health_margin": 3.0})})
    wide = make_plan(_load(doc), wider).router
    assert wide is not None and wide.settings.health_check_timeout_s == math.ceil(3 * 4 * prefill)


def test_a_dense_model_behind_a_router_plans_with_an_untimed_prefill() -> None:
    # The tiny dense Llama of the real-vLLM tier: the K3-shaped prefill model divided by its zero experts.
    cat = load_catalog((ROOT / "tests" / "assets" / "catalog",))
    doc = _doc()
    doc.update(model={"id": "tiny-llama", "path": "/tmp/k3deploy-replicas/tiny-llama"}, hardware={"gpu": "cpu-host", "gpus_per_node": 1},
               parallel={"tp": 1}, serving={"context_length": 2048, "max_running_requests": 4})
    doc["engine"] = {"kind": "vllm", "port": 18000}
    doc["router"]["kind"] = "vllm-router"
    router = make_plan(_load(doc), cat).router
    assert router is not None and router.longest_prefill_s is None
    assert router.prefill_unknown is not None and "MLA + MoE" in router.prefill_unknown, router
    assert router.settings.health_check_timeout_s == HEALTH_TIMEOUT_UNKNOWN_S


def test_hand_set_timeouts_below_the_plan_warn() -> None:
    doc = _doc()
    doc["router"].update(health_check_timeout_s=1, startup_timeout_s=60)
    doc["serving"]["context_length"] = 32768
    plan = _plan(doc)
    warned = {i.code: i for i in plan.issues if i.severity == "warning"}
    assert plan.router is not None and plan.router.settings.startup_timeout_s == 60
    assert "ROUTER_STARTUP_TIMEOUT" in warned and warned["ROUTER_STARTUP_TIMEOUT"].line is not None
    prefill = plan.router.longest_prefill_s
    assert prefill is not None
    assert ("ROUTER_HEALTH_TIMEOUT" in warned) == (prefill >= 1)


def test_unknown_policy_of_the_router_is_an_input_error() -> None:
    doc = _doc()
    doc["router"]["policy"] = "kv_aware"  # vllm-router has it, smg does not
    plan = _plan(doc)
    bad = [i for i in plan.issues if i.code == "ROUTER_POLICY"]
    assert not plan.valid and bad and f"r.yaml:{bad[0].line}:{bad[0].column}" == _at(doc, "policy", "kv_aware") and "smg has no policy 'kv_aware'" in bad[0].message
