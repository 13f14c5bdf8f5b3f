"""`k3deploy validate` stages long, prefix-cache and effort against the stand-in launched over SSH across four
network-namespace hosts (TP4/EP4): a clean deployment passes all three; each stand-in fault fails exactly the
stage that must catch it (issue 19's state faults: `long`, and `prefix-cache` on a hit), the evidence named."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.sim_deployments import SimDeployments, cli, write_tiny_checkpoint
from tests.polling import wait_for
from tests.rig import HostRig
from tests.validate_serving import SERVING, VALIDATE

pytestmark = pytest.mark.integration
STAGES = ("long", "prefix-cache", "effort")
# TP4 decodes ~4x faster than one node: slow_decode's factor and the threshold are set for the rig.
MIN_THROUGHPUT = 600.0
# fault -> {stage: pattern its detail must match}; every stage not named must pass.
FAULTS: dict[str, dict[str, str]] = {
    "": {},
    "no_prefix_cache": {"prefix-cache": r"turn 2 cached_tokens 0 < [\d,]+ predicted .*prefix caching is off"},
    "no_cache_report": {"prefix-cache": r"cached_tokens not reported \(unknown, not zero\): start the engine with "
                                        r"--enable-cache-report"},
    "wrong_cache_state": {"prefix-cache": r"a cache hit changed the answer: token \d+ is .* on the hit"},
    "short_context:2600": {"long": r"failed: .*Input length \([\d]+ tokens\) exceeds the maximum allowed length "
                                   r"\(2599 tokens\).*rank 0 serves max_model_len 2,600 < serving.context_length"},
    "slow_decode:200": {"effort": r"cold: [\d,]+ output tokens/s < validate.min_throughput_tok_s 600"},
    "kda_state_zeroed": {"long": r"^facts lost at 10%, 50%, 90% \(retrieved at none\)",
                         "prefix-cache": r"on the cache hit, facts lost at 10%, 50%, 90%"},
    "kda_state_lost_beyond:2000": {"long": r"^facts lost at 10% \(retrieved at 50%, 90%\)"},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture
def deployments(rig4: HostRig, checkpoint: Path, tmp_path: Path) -> Iterator[SimDeployments]:
    d = SimDeployments(rig4, checkpoint, tmp_path, {"executor": "ssh", "ssh": {
        "user": "root", "key": str(rig4.key_path), "known_hosts": str(rig4.known_hosts_path),
        "connect_timeout_s": 2}})
    yield d
    problems = d.stop_leftovers()
    assert wait_for(lambda: not any(rig4.pids(h) for h in rig4.hosts), 10.0) or problems.append("processes left")
    assert problems == [], problems


def small(topology: Path) -> Path:
    """The rig topology with the request stages' small settings (tests/validate_serving.py)."""
    doc: dict[str, Any] = yaml.safe_load(topology.read_text())
    doc["serving"] = SERVING
    doc["validate"] = {**VALIDATE, "min_throughput_tok_s": MIN_THROUGHPUT}
    topology.write_text(yaml.safe_dump(doc, sort_keys=False))
    return topology


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", list(FAULTS), ids=[f.split(":")[0] or "clean" for f in FAULTS])
def test_each_fault_fails_exactly_its_stage(deployments: SimDeployments, fault: str) -> None:
    name = "vq-" + (fault.split(":")[0].replace("_", "-") or "clean")
    env = {"K3SIM_SPEED": "8", **({"K3SIM_FAULT": fault} if fault else {})}
    topo = small(deployments.topology(name, env=env))
    launched = cli("launch", str(topo))
    assert launched.returncode == 0, launched.stdout + launched.stderr
    try:
        done = cli("validate", str(topo), "--only", ",".join(STAGES), "--json", timeout_s=200)
    finally:
        cli("stop", str(topo))
    report = json.loads(done.stdout)
    expected = FAULTS[fault]
    assert done.returncode == (1 if expected else 0), done.stdout + done.stderr
    for stage in report["stages"]:
        if stage["name"] in expected:
            assert stage["status"] == "fail", stage
            assert re.search(expected[stage["name"]], stage["detail"]), stage["detail"]
        else:
            assert stage["status"] == "pass", stage
