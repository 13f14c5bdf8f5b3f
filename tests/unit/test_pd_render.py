"""Prefill/decode roles rendered: every instance's command (flags the pinned engine parses), ports and env per
node, the PD router, the exports a role refuses, `render` selection of a role, the schema of roles."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.flag_tables import flag_table
from k3deploy.engines.render import render_nodes
from k3deploy.engines.router import argv_problems
from k3deploy.planning.pd import instance_inputs
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import load_topology
from k3deploy.topology.pd import instances
from tests.k3deploy_cli import run_k3deploy
from tests.unit.test_pd import SGLANG, VLLM, _doc, _plan

pytestmark = pytest.mark.timeout(60)


def _rendered(path_or_doc: Path | dict[str, Any]) -> tuple[Plan, list[Any]]:
    plan = make_plan(load_topology(path_or_doc), load_catalog()) if isinstance(path_or_doc, Path) \
        else _plan(path_or_doc)
    return plan, [(inst, render_nodes(instance_inputs(plan, inst))) for inst in instances(plan.topology)]


def _flag_problems(family: str, argv: tuple[str, ...]) -> list[str]:
    """Flags after the model path the pinned engine's parser has no entry for (the stand-in's launcher
    prefix, e.g. --mimic, is its own)."""
    table = flag_table(family)  # type: ignore[arg-type]
    rest, out = list(argv[argv.index("--host"):]), []
    while rest:
        word = rest.pop(0)
        flag = table.get(word)
        if flag is None:
            out.append(f"no flag {word}")
        elif flag.takes_value:
            problem = table.value_problem(flag, rest.pop(0))
            out += [problem] if problem else []
    return out


def test_sglang_2p1d_commands_ports_and_router() -> None:
    doc = _doc()
    doc["nodes"] += [{"host": "localhost", "ip": "127.0.0.5", "iface": "lo"},
                     {"host": "localhost", "ip": "127.0.0.6", "iface": "lo"}]
    doc["roles"]["prefill"] = {"instances": 2, "nodes": ["127.0.0.1", "127.0.0.2", "127.0.0.5", "127.0.0.6"],
                               "parallel": {"tp": 2, "ep": 2}}
    plan, rendered = _rendered(doc)
    seen = {}
    for inst, specs in rendered:
        for spec in specs:
            assert _flag_problems("sglang", spec.argv) == []
            a = spec.argv
            assert a[a.index("--disaggregation-mode") + 1] == inst.role
            boot = a[a.index("--disaggregation-bootstrap-port") + 1] if "--disaggregation-bootstrap-port" in a else None
            assert boot == (str(18998 + inst.index) if inst.role == "prefill" else None)
            assert a[a.index("--port") + 1] == str(18000 + inst.number)
            assert a[a.index("--dist-init-addr") + 1].endswith(f":{29500 + inst.number}")
        seen[(inst.role, inst.index)] = specs[0].ip
    assert seen == {("prefill", 0): "127.0.0.1", ("prefill", 1): "127.0.0.5", ("decode", 0): "127.0.0.3"}
    assert plan.router is not None
    s = plan.router.settings
    assert s.prefill == (("http://127.0.0.1:18000", 18998), ("http://127.0.0.5:18001", 18999))
    assert s.decode == ("http://127.0.0.3:18002",)
    argv = plan.router and __import__("k3deploy.engines.router", fromlist=["router_argv"]).router_argv(s)
    assert argv_problems("smg", argv[3:]) == []
    assert "--worker-urls" not in argv and "--pd-disaggregation" in argv
    i = argv.index("--prefill")
    assert argv[i:i + 3] == ("--prefill", "http://127.0.0.1:18000", "18998")


def test_vllm_commands_env_per_node_and_router() -> None:
    plan, rendered = _rendered(VLLM)
    ports = []
    for inst, specs in rendered:
        for spec in specs:
            assert _flag_problems("vllm", spec.argv) == []
            cfg = json.loads(spec.argv[spec.argv.index("--kv-transfer-config") + 1])
            assert cfg == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
            assert spec.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == spec.ip  # each node its own (vllm#27083)
            assert spec.env["UCX_NET_DEVICES"] == "mlx5_0,mlx5_1"
            assert not any(a.startswith("--disaggregation") for a in spec.argv)
        ports.append(int(specs[0].env["VLLM_NIXL_SIDE_CHANNEL_PORT"]))
    assert ports == [5600, 5602]  # each instance's DP ranks listen on base + DP index: 2 ports apart
    assert plan.router is not None
    from k3deploy.engines.router import router_argv

    argv = router_argv(plan.router.settings)
    assert argv_problems("vllm-router", argv[3:]) == []
    assert "--vllm-pd-disaggregation" in argv and argv[argv.index("--kv-connector") + 1] == "nixl"
    i = argv.index("--prefill")
    assert argv[i:i + 3] == ("--prefill", "http://10.0.0.10:8000", "--decode")  # NIXL: no bootstrap port


@pytest.mark.parametrize("fmt", ["slurm", "lws"])
def test_slurm_and_lws_exports_of_one_role_are_refused(fmt: str) -> None:
    r = run_k3deploy("render", str(SGLANG), "--format", fmt, "--role", "decode")
    assert r.returncode == 2 and "covers every role" in r.stderr and "drop --role" in r.stderr, r.stderr


def test_render_script_and_json_and_role_selection(tmp_path: Path) -> None:
    r = run_k3deploy("render", str(SGLANG), "--format", "script", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "router.sh" in names and any(n.startswith("prefill0-") for n in names) \
        and any(n.startswith("decode0-") for n in names)
    assert "--pd-disaggregation" in (tmp_path / "router.sh").read_text(encoding="utf-8")
    doc = json.loads(run_k3deploy("render", str(SGLANG), "--format", "json").stdout)
    assert [i["role"] for i in doc["instances"]] == ["prefill", "decode"] and doc["router"]["prefill"][0][1] == 8998
    only = run_k3deploy("render", str(SGLANG), "--role", "decode").stdout
    assert "--disaggregation-mode decode" in only and "prefill0" not in only and "router" not in only
    bad = run_k3deploy("render", str(SGLANG), "--role", "encode")
    assert bad.returncode == 2 and "no such role" in bad.stderr


def test_schema_covers_roles() -> None:
    doc = json.loads(run_k3deploy("schema").stdout)
    props = doc["properties"]["roles"]
    text = json.dumps(doc)
    assert "Roles" in text and "bootstrap_port" in text and "side_channel_port" in text, props
