"""Stages long, prefix-cache and effort against the stand-in engine launched on this machine, over real HTTP:
a clean deployment passes each, a faulty one fails the stage that must catch it, naming what it found (a slow
decode fails effort against its prediction on both dialects in tests/unit/test_validate_fault_grid.py)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.executors.http import NodeHttp
from k3deploy.executors.local import LocalExecutor
from k3deploy.validate.loadgen import CHAT_PATH, run_load_on_node, summarize
from tests.validate_serving import launched, sim_topology, statuses, validate_json

# The stand-in nodes these tests serve from rendezvous over Gloo: torch (skipped in the 3.10 run).
pytestmark = [pytest.mark.timeout(240), pytest.mark.torch]
STAGES = ("long", "prefix-cache", "effort")
BENCH_FIELDS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One clean SGLang-mimicking deployment, validated once."""
    tmp = tmp_path_factory.mktemp("clean")
    topo = sim_topology(tmp, "vr-clean", checkpoint)
    with launched(topo):
        yield topo, validate_json(topo, *STAGES, html=tmp / "report.html")


def stage(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["stages"] if s["name"] == name)


def test_a_clean_deployment_passes_every_request_stage(clean: tuple[Path, dict[str, Any]]) -> None:
    topo, report = clean
    assert statuses(report) == dict.fromkeys(STAGES, "pass"), report
    long = stage(report, "long")
    assert long["results"]["retrieved"] == {"10%": True, "50%": True, "90%": True}
    assert abs(long["results"]["prompt_tokens"] - 3000) < 100  # validate.long_request_tokens
    assert re.search(r"[\d,]+ prompt tokens, TTFT [\d.]+ s, facts retrieved at every depth", long["detail"])
    cache = stage(report, "prefix-cache")["results"]
    assert cache["cached_tokens"] >= cache["predicted_cached_tokens"] > 0
    assert cache["predicted_cached_tokens"] % 512 == 0 and cache["cold_cached_tokens"] == 0
    effort = stage(report, "effort")
    results = effort["results"]
    assert (results["reasoning_effort"], results["effort_via"], results["route"]) == ("low", "reasoning_effort",
                                                                                      "here")
    for workload in ("cold", "prefix_hit"):
        summary = results[workload]
        assert all(field in summary for field in BENCH_FIELDS), sorted(summary)
        assert summary["completed"] == 8 and summary["failed"] == 0
        assert 0.7 < summary["reasoning_token_share"] < 0.95  # K3 at low effort: ~82% reasoning
        assert summary["median_ttfa_ms"] > summary["median_ttft_ms"]  # the answer comes after the reasoning
    assert results["cold"]["cached_token_share"] == 0 and results["prefix_hit"]["cached_token_share"] > 0.3
    assert "load ran from here" in effort["detail"]
    # held against the planner's prediction for the deployed shape at the measured lengths
    predicted = results["predicted"]
    assert predicted["workload"]["concurrency"] == 4 and predicted["workload"]["num_prompts"] == 8
    assert predicted["workload"]["output_tokens"] == round(results["cold"]["total_output_tokens"] / 8)
    assert predicted["bounds"]["tpot"] == "the decode step, bound by HBM reads"
    assert min(results["share_of_predicted"]["decode"], results["share_of_predicted"]["output_throughput"]) >= 0.2
    assert re.search(r"predicted for cold \([\d,]+ in / \d+ out, concurrency 4\): [\d,]+ tok/s out", effort["evidence"])
    # --html of the same run: every stage, and the effort stage's distributions drawn against the prediction
    page = (topo.parent / "report.html").read_text()
    assert all(f"<h3>{name} <span class=\"pass\">PASS</span>" in page for name in STAGES)
    assert ">effort latency distributions</title>" in page and ">TPOT ms</text>" in page
    assert f"{results['cold']['p99_tpot_ms']:,.2f}" in page and f"{predicted['mean_tpot_ms']:,.2f}" in page


def test_thresholds_from_the_topology_decide_the_effort_stage(clean: tuple[Path, dict[str, Any]]) -> None:
    topo, _ = clean
    doc = yaml.safe_load(topo.read_text())
    doc["validate"].update(min_throughput_tok_s=1e9, max_p99_ttft_s=0.0001, max_mean_tpot_ms=0.0001)
    strict = topo.with_name("strict.yaml")  # the same deployment (by name), stricter thresholds
    strict.write_text(yaml.safe_dump(doc))
    effort = stage(validate_json(strict, "effort"), "effort")
    assert effort["status"] == "fail"
    for pattern in (r"cold: [\d,]+ output tokens/s < validate.min_throughput_tok_s 1,000,000,000",
                    r"prefix_hit: p99 TTFT [\d,]+ ms > validate.max_p99_ttft_s 0.0001 s",
                    r"cold: mean TPOT [\d.]+ ms > validate.max_mean_tpot_ms 0.0001"):
        assert re.search(pattern, effort["detail"]), effort["detail"]


def test_the_load_can_run_on_the_node(clean: tuple[Path, dict[str, Any]]) -> None:
    """As over Ray: the executor cannot forward a port, so the run is made on the node by one python3."""
    class NoForward(LocalExecutor):
        def forward(self, remote_host: str, remote_port: int) -> None:
            return None

    topo, _ = clean
    doc = yaml.safe_load(topo.read_text())
    url = f"http://127.0.0.1:{doc['engine']['port']}"
    body = {"model": "kimi-k3-tiny", "messages": [{"role": "user", "content": "hello"}], "stream": True,
            "stream_options": {"include_usage": True}, "reasoning_effort": "low", "max_tokens": 64}
    with NodeHttp(url, via=NoForward("node0")) as http:
        assert http.url_here(CHAT_PATH) is None and http.route == "on-node"
        summary = summarize(run_load_on_node(http, [body] * 3, 3, 30.0), gpus=1)
    assert summary["completed"] == 3 and summary["total_output_tokens"] == 3 * 64
    assert summary["mean_ttft_ms"] > 0 and summary["mean_itl_ms"] >= 0


def test_faults_fail_the_stage_that_catches_them_and_list_every_problem(tmp_path: Path, checkpoint: Path) -> None:
    """A facts-losing state (the first 10% of the long prompt), a cache restoring the wrong state and no
    cached-token report, all at once."""
    topo = sim_topology(tmp_path, "vr-faults", checkpoint,
                        fault="kda_state_lost_beyond:2000,wrong_cache_state,no_cache_report")
    with launched(topo):
        report = validate_json(topo, *STAGES)
    assert statuses(report) == {"long": "fail", "prefix-cache": "fail", "effort": "pass"}, report
    assert stage(report, "long")["detail"].startswith("facts lost at 10% (retrieved at 50%, 90%)")
    cache = stage(report, "prefix-cache")["detail"]
    assert "turn 2 cached_tokens not reported (unknown, not zero): start the engine with --enable-cache-report" \
        in cache
    assert "on the cache hit, facts lost at" in cache
    assert re.search(r"a cache hit changed the answer: token \d+ is '.+' on the hit, '.+' cold \(after POST /flush_cache\)", cache)


def test_vllm_dialect_short_context_and_effort_through_the_chat_template(tmp_path: Path, checkpoint: Path) -> None:
    """vLLM's dialect (the cold request cache-salted, no development-mode endpoint needed), chat_template_kwargs
    for the effort, and an engine serving a shorter context than configured: only `long` fails, with the
    engine's own words."""
    topo = sim_topology(tmp_path, "vr-vllm", checkpoint, mimic="vllm", fault="short_context:2600")
    with launched(topo):
        report = validate_json(topo, *STAGES)
    assert statuses(report) == {"long": "fail", "prefix-cache": "pass", "effort": "pass"}, report
    long = stage(report, "long")["detail"]
    assert "This model's maximum context length is 2600 tokens" in long
    assert "rank 0 serves max_model_len 2,600 < serving.context_length 8,192" in long
    cache = stage(report, "prefix-cache")
    assert "hit and cold (cache-salted) answers equal token for token" in cache["detail"], cache
    assert cache["results"]["cold_cached_tokens"] == 0 < cache["results"]["cached_tokens"]
    assert stage(report, "effort")["results"]["effort_via"] == "chat_template_kwargs"


def test_the_predicted_hit_is_turn_ones_messages_rounded_down_to_a_block() -> None:
    from k3deploy.planning.prefix_hits import predicted_hit_tokens

    # kimi-k3.md's worked example: 2,800 tokens matched (plus the 3-token assistant opener) -> 2,560 hit.
    assert predicted_hit_tokens(2803, 512) == 2560
    assert predicted_hit_tokens(8195, 512) == 8192 and predicted_hit_tokens(8194, 512) == 7680
    assert predicted_hit_tokens(400, 512) == 0  # shorter than a block: no hit on a hybrid model
