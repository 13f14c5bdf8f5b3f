"""The accuracy stage runs lm-eval for real (local-chat-completions) against a launched stand-in on a small local
dataset (k3deploy/validate/data, the demo's): the score and the completed / failed / missing / unparsed counts against the
catalog's reference; a lost KDA state scores below it and fails, naming the counts; no dataset skips."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.k3deploy_cli import run_k3deploy as cli
from tests.validate_serving import launched, sim_topology

# The stand-in nodes rendezvous over Gloo: torch (skipped in the 3.10 run).
pytestmark = [pytest.mark.timeout(300), pytest.mark.torch]
DATASET = Path(__file__).resolve().parents[2] / "k3deploy" / "validate" / "data" / "recall-mc.jsonl"


def accuracy_stage(topology: Path, *extra: str) -> dict[str, Any]:
    done = cli("validate", str(topology), "--json", "--only", "accuracy", *extra, timeout_s=240)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return next(s for s in json.loads(done.stdout)["stages"] if s["name"] == "accuracy")


@pytest.mark.parametrize("fault", ["", "kda_state_zeroed"])
def test_the_harness_scores_the_deployment_against_the_reference(tmp_path: Path, checkpoint: Path, fault: str) -> None:
    pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install -e '.[accuracy]'")
    topo = sim_topology(tmp_path, f"acc-{fault or 'clean'}", checkpoint, mimic="vllm", fault=fault)
    with launched(topo):
        stage = accuracy_stage(topo, "--accuracy-dataset", str(DATASET))
        if not fault:
            unset = accuracy_stage(topo)
            assert unset["status"] == "skip" and "no dataset: pass --accuracy-dataset FILE" in unset["detail"]
    got = stage["results"]
    assert (got["task"], got["samples"], got["failed"], got["missing"], got["reference"]) == \
        ("k3deploy-recall-mc", 6, 0, 0, 1.0), stage
    if not fault:
        assert stage["status"] == "pass" and (got["completed"], got["unparsed"], got["score"]) == (6, 0, 1.0), stage
        assert stage["detail"] == ("k3deploy-recall-mc: score 1.000 (6 samples: 6 completed, 0 failed, 0 missing, "
                                   "0 unparsed), at least the reference 1.000 - 0.000")
    else:  # the facts are gone from the state: fluent answers without a letter
        assert stage["status"] == "fail" and (got["completed"], got["unparsed"], got["score"]) == (0, 6, 0.0), stage
        assert stage["detail"].startswith("k3deploy-recall-mc: score 0.000 (6 samples: 0 completed, 0 failed, 0 "
                                          "missing, 6 unparsed) below the reference 1.000 - 0.000 for kimi-k3-tiny")
        assert "not completed: 'The answer letter of item-1 is " in stage["evidence"]


def test_a_dataset_that_is_not_there_is_named(tmp_path: Path, checkpoint: Path) -> None:
    topo = sim_topology(tmp_path, "acc-none", checkpoint)
    done = cli("validate", str(topo), "--only", "accuracy", "--accuracy-dataset", str(tmp_path / "none.jsonl"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--accuracy-dataset {tmp_path / 'none.jsonl'}: no such file" in done.stdout + done.stderr
