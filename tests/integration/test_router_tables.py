"""The router flag tables against the real routers (the venv scripts/routers_venv.sh makes): each committed
table is what its router's parser says today, and the command k3deploy renders for each router is accepted
by that router's own argument parser."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from k3deploy.engines.router import ROUTER_DATA, ROUTER_TABLES, RouterSettings, router_argv

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("K3DEPLOY_ROUTERS_VENV") or Path.home() / ".cache" / "k3deploy" / "routers")
READY = VENV / ".k3deploy-routers-ready"
needs_routers = pytest.mark.skipif(not READY.is_file(), reason=f"no routers venv at {VENV} "
                                   "(scripts/test.sh makes it with scripts/routers_venv.sh)")
# The real parser, as each router's `python -m PACKAGE.launch_router` calls it on its command line.
PARSE = ("import sys, importlib; m = importlib.import_module(sys.argv[1]); "
         "a = m.parse_router_args(sys.argv[2:]); print(a.policy, a.prometheus_host, a.prometheus_port, ' '.join(a.worker_urls))")


@needs_routers
@pytest.mark.parametrize("kind", sorted(ROUTER_TABLES))
def test_committed_table_is_the_real_parser(kind: str) -> None:
    code = ("import json, sys; sys.path.insert(0, 'scripts'); import router_flag_tables as r; "
            f"print(json.dumps(r.table({kind!r})))")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", code], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    committed = json.loads((ROUTER_DATA / ROUTER_TABLES[kind]).read_text(encoding="utf-8"))
    assert json.loads(out.stdout) == committed, f"regenerate with scripts/router_flag_tables.py ({kind})"


@needs_routers
@pytest.mark.parametrize("kind", sorted(ROUTER_TABLES))
def test_rendered_router_command_is_accepted_by_the_real_parser(kind: str) -> None:
    s = RouterSettings(kind=kind, listen="127.0.0.1", port=30000,
                       worker_urls=("http://10.0.0.1:8000", "http://10.0.0.3:8001"), policy="cache_aware",
                       health_failure_threshold=3, health_success_threshold=2, health_check_interval_s=10,
                       health_check_timeout_s=262, startup_timeout_s=5940, metrics_port=30001)
    argv = router_argv(s, str(VENV / "bin" / "python"))
    out = subprocess.run([argv[0], "-c", PARSE, argv[2], *argv[3:]], capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr
    # the metrics server on the router's address and its own port, not the routers' shared 0.0.0.0:29000
    assert out.stdout.split() == ["cache_aware", "127.0.0.1", "30001", "http://10.0.0.1:8000", "http://10.0.0.3:8001"]
    bad = subprocess.run([argv[0], "-c", PARSE, argv[2], "--policy", "no_such"], capture_output=True, text=True, check=False,
                         timeout=240)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr  # the parser checks what we rely on


# What the real parser made of a PD command: the mode switch, each prefill with its bootstrap port, each decode.
PARSE_PD = ("import sys, importlib, json; m = importlib.import_module(sys.argv[1]); "
            "a = vars(m.parse_router_args(sys.argv[2:])); print(json.dumps([bool(a.get('pd_disaggregation') or "
            "a.get('vllm_pd_disaggregation')), a['prefill_urls'], a['decode_urls'], a['prefill_policy'], "
            "a['decode_policy'], a.get('kv_connector'), a['prometheus_host'], a['prometheus_port']]))")


@needs_routers
@pytest.mark.parametrize("kind", sorted(ROUTER_TABLES))
def test_rendered_pd_router_command_is_accepted_by_the_real_parser(kind: str) -> None:
    sglang = kind != "vllm-router"  # SGLang prefills run a bootstrap server; vLLM NIXL has none
    prefill = (("http://10.0.0.1:8000", 8998 if sglang else None), ("http://10.0.0.5:8001", 8999 if sglang else None))
    s = RouterSettings(kind=kind, listen="127.0.0.1", port=30000, worker_urls=(), policy="cache_aware",
                       health_failure_threshold=3, health_success_threshold=2, health_check_interval_s=10,
                       health_check_timeout_s=262, startup_timeout_s=5940, metrics_port=30001, prefill=prefill,
                       decode=("http://10.0.0.3:8002",))
    argv = router_argv(s, str(VENV / "bin" / "python"))
    out = subprocess.run([argv[0], "-c", PARSE_PD, argv[2], *argv[3:]], capture_output=True, text=True, timeout=240,
                         check=False)
    assert out.returncode == 0, out.stderr
    mode, prefills, decodes, p_policy, d_policy, connector, metrics_host, metrics_port = json.loads(out.stdout)
    assert (metrics_host, metrics_port) == ("127.0.0.1", 30001)
    assert mode is True and decodes == ["http://10.0.0.3:8002"] and p_policy == d_policy == "cache_aware"
    assert [tuple(p) for p in prefills] == list(prefill)  # the bootstrap port the engines were given
    assert connector == (None if sglang else "nixl")
