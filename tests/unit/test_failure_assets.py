"""Real failures produced here (tests/assets/failures, how: its README) named by the failure catalog, clean
start-ups named by nothing, and `k3deploy explain` over them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k3deploy.engines.failures import explain, root_cause
from tests.k3deploy_cli import ROOT, k3deploy_argv, run_k3deploy

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "failures"
CLEAN = ("vllm-clean.log", "sim-clean.log")
# log -> the signature that names its failure (the root cause, as the failure line quotes it)
FAILED = {
    "vllm-port-taken.log": "http-port-in-use",
    "vllm-worker-killed.log": "worker-killed-no-status",
    "vllm-kv-too-small.log": "kv-cache-too-small-vllm",
    "vllm-tp-heads.log": "tp-not-dividing-heads",
    "vllm-missing-checkpoint.log": "checkpoint-missing",
    "vllm-wrong-iface.log": "gloo-iface-unknown",
    "sim-port-taken.log": "http-port-in-use",
    "sim-crash-after-load.log": "sim-crash-after-load",
    "sim-oom.log": "oom-gpu",
}


def _log(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", CLEAN)
def test_a_clean_start_up_has_no_known_cause(name: str) -> None:
    assert explain(_log(name)) == []


@pytest.mark.parametrize(("name", "sig_id"), sorted(FAILED.items()))
def test_a_real_failure_is_named(name: str, sig_id: str) -> None:
    found = root_cause(_log(name), {"host": "node-1", "ip": "10.0.0.11", "iface": "ens-priv", "rank": "1"})
    assert found is not None and found.signature.id == sig_id, found and found.signature.id


def test_explain_cli_exit_codes_text_and_json() -> None:
    run = run_k3deploy("explain", "--json", ASSETS / "vllm-tp-heads.log", ASSETS / "sim-clean.log")
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    (tp,), clean = (d["findings"] for d in doc["logs"])
    assert clean == [] and tp["id"] == "tp-not-dividing-heads" and tp["lines"]
    assert "parallel.tp to a divisor of 4 (1, 2, 4)" in tp["fix"] and "vllm/config/model.py" in tp["source"]
    clean_run = subprocess.run(k3deploy_argv("explain", "-", ASSETS / "vllm-clean.log"), input=_log("sim-clean.log"),
                               capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert clean_run.returncode == 0
    assert clean_run.stdout.splitlines() == ["stdin: no known cause", f"{ASSETS / 'vllm-clean.log'}: no known cause"]
    missing = run_k3deploy("explain", ASSETS / "no-such.log")
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr


def test_logs_names_the_cause_beside_a_nodes_log_as_launch_does(capsys: pytest.CaptureFixture[str]) -> None:
    from k3deploy.cli.logs import _name_cause
    from k3deploy.launch.lookup import NodeLog

    _name_cause(NodeLog(rank=1, host="node-1", source="none", text=_log("sim-oom.log")))
    _name_cause(NodeLog(rank=0, host="node-0", source="none", text=_log("sim-clean.log")))
    # The node's address and interface fill the fix as in launch's failure line (not "<ip>").
    _name_cause(NodeLog(rank=0, host="node-0", source="none", text=_log("vllm-wrong-iface.log"), ip="10.0.0.5",
                        iface="ens-bogus"))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("==> rank 1 node-1: the accelerator ran out of memory") and "[oom-gpu]" in err[0]
    assert err[1].startswith("==> rank 0 node-0: GLOO_SOCKET_IFNAME names an interface") and (
        "set nodes[0].iface to the interface that carries 10.0.0.5 on node-0") in err[1] and "<ip>" not in err[1], err
