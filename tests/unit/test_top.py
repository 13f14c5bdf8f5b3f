"""`top`'s figures from canned /metrics pages under the real vLLM's metric names, the laggard named, a missing
source named without figures, and the terminal view and JSON carrying the same numbers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from k3deploy.engines.engine_metrics import figures, parse_sample
from k3deploy.errors import ExecError
from k3deploy.launch.top import Predicted, Source, Watch
from k3deploy.launch.top_view import top_view


def vllm_page(*, running: int, waiting: int, kv: float, hits: int, queries: int, prompt: int, gen: int, done: int,
              ttft_s: float, itl_s: float, tokens: int) -> str:
    """A page as vLLM 0.32.0 writes these families (labels, HELP/TYPE lines and a second engine's series)."""
    lab = 'engine="0",model_name="k3"'
    return "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} {running}.0",
        f"vllm:num_requests_waiting{{{lab}}} {waiting}.0",
        f"vllm:kv_cache_usage_perc{{{lab}}} {kv}",
        f"vllm:prefix_cache_hits_total{{{lab}}} {hits}.0",
        f"vllm:prefix_cache_queries_total{{{lab}}} {queries}.0",
        f"vllm:prompt_tokens_total{{{lab}}} {prompt}.0",
        f"vllm:generation_tokens_total{{{lab}}} {gen}.0",
        f'vllm:request_success_total{{{lab},finished_reason="length"}} {done}.0',
        f'vllm:request_success_total{{{lab},finished_reason="stop"}} 0.0',
        f'vllm:time_to_first_token_seconds_bucket{{{lab},le="0.1"}} {done}.0',
        f"vllm:time_to_first_token_seconds_sum{{{lab}}} {ttft_s}",
        f"vllm:time_to_first_token_seconds_count{{{lab}}} {done}.0",
        f"vllm:inter_token_latency_seconds_sum{{{lab}}} {itl_s}",
        f"vllm:inter_token_latency_seconds_count{{{lab}}} {tokens}.0",
        "vllm:cache_config_info{block_size=\"16\"} 1.0",
    ]) + "\n"


ZERO = vllm_page(running=0, waiting=0, kv=0.0, hits=0, queries=0, prompt=0, gen=0, done=0, ttft_s=0, itl_s=0,
                 tokens=0)


def test_window_figures_from_vllm_names() -> None:
    first = parse_sample(ZERO, 10.0)
    last = parse_sample(vllm_page(running=4, waiting=2, kv=0.25, hits=300, queries=1000, prompt=1000, gen=500,
                                  done=5, ttft_s=0.5, itl_s=9.9, tokens=495), 20.0)
    f = figures(first, last)
    assert (f.running, f.waiting, f.kv_use) == (4, 2, 0.25)
    assert f.prefix_hit_rate == 0.3
    assert f.generated_tok_s == 50.0
    assert f.ttft_ms == 100.0 and abs(f.tpot_ms - 20.0) < 1e-9
    assert (f.input_tokens, f.output_tokens, f.requests_done) == (200.0, 100.0, 5.0)


def test_counter_reset_counts_from_zero_and_absent_metric_is_none() -> None:
    before = parse_sample(vllm_page(running=0, waiting=0, kv=0, hits=0, queries=0, prompt=900, gen=900, done=9,
                                    ttft_s=1, itl_s=1, tokens=9), 0.0)
    after = parse_sample("vllm:generation_tokens_total 100\n", 10.0)
    f = figures(before, after)
    assert f.generated_tok_s == 10.0  # the engine restarted: 100 new tokens, not -800
    assert f.running is None and f.ttft_ms is None and f.prefix_hit_rate is None


class Pages:
    """A fake scrape: each URL's pages in turn; a URL with an error string raises it."""

    def __init__(self, pages: dict[str, list[str]]) -> None:
        self.pages = pages

    def __call__(self, url: str) -> str:
        page = self.pages[url].pop(0)
        if page.startswith("ERR "):
            raise ExecError(page[4:])
        return page


def _busy(itl_s: float) -> str:
    return vllm_page(running=3, waiting=0, kv=0.5, hits=0, queries=1000, prompt=1000, gen=1000, done=10,
                     ttft_s=1.0, itl_s=itl_s, tokens=990)


def _watch(pages: dict[str, list[str]], predict: Predicted | str | None = None) -> Watch:
    clock = iter(range(0, 1000, 2))
    sources = [Source(label="svc-r0", url="http://a", kind="instance", file="t.yaml"),
               Source(label="svc-r1", url="http://b", kind="instance", file="t.yaml"),
               Source(label="router", url="http://r", kind="router")]
    return Watch("svc", sources, 30.0, scrape=Pages(pages),
                 predict=(lambda *_: predict) if predict is not None else None, clock=lambda: float(next(clock)))


PRED = Predicted(concurrency=3, input_tokens=100, output_tokens=100, generated_tok_s=480.0, ttft_ms=90.0,
                 tpot_ms=10.0, capacity_running=64, capacity_tok_s=3000.0, band="calibrated ±30%")


def test_slow_replica_stands_out_against_others_and_prediction() -> None:
    w = _watch({"http://a": [ZERO, _busy(9.9)], "http://b": [ZERO, _busy(99.0)],
                "http://r": ["ERR connection refused", "ERR connection refused"]}, PRED)
    w.poll()
    w.poll()
    rows = {r.label: r for r in w.report().rows}
    assert not rows["svc-r0"].lag
    assert "TPOT 10.0x the others'" in rows["svc-r1"].lag and "10.0x the predicted 10.0 ms" in rows["svc-r1"].lag
    assert rows["svc-r1"].predicted == PRED
    assert rows["router"].missing == "http://r/metrics: connection refused" and rows["router"].running is None

    console = Console(width=160, record=True, color_system=None)
    console.print(top_view(w.report()))
    text = console.export_text()
    assert "svc-r1 LAGS: TPOT 10.0x" in text
    lines = text.splitlines()
    r1 = next(i for i, ln in enumerate(lines) if ln.startswith("│ svc-r1 "))
    # 1,000 tokens over the 4 s between its two scrapes (the fake clock steps 2 s a scrape)
    assert [c.strip() for c in lines[r1].split("│")[2:9]] == ["3", "0", "50%", "0%", "250", "100.0", "100.0"]
    assert [c.strip() for c in lines[r1 + 1].split("│")[1:9]] == ["predicted", "cap 64", "", "", "", "480", "90.0",
                                                                   "10.0"], lines[r1 + 1]
    assert "router: no figures: http://r/metrics: connection refused" in text
    js = json.loads(w.report().model_dump_json())
    assert [r["tpot_ms"] for r in js["rows"][:2]] == [rows["svc-r0"].tpot_ms, rows["svc-r1"].tpot_ms]
    assert js["rows"][1]["predicted"]["capacity_running"] == 64


def test_a_source_that_fails_loses_its_window() -> None:
    w = _watch({"http://a": [ZERO, _busy(9.9), "ERR timed out", _busy(9.9)], "http://b": [ZERO] * 4,
                "http://r": [ZERO] * 4})
    for _ in range(3):
        w.poll()
    row = w.report().rows[0]
    assert row.missing == "http://a/metrics: timed out" and row.tpot_ms is None
    w.poll()
    assert w.report().rows[0].missing == "waiting for a second scrape"  # no window across the gap


def test_window_keeps_samples_within_it() -> None:
    w = _watch({"http://a": [ZERO] * 40, "http://b": [ZERO] * 40, "http://r": [ZERO] * 40})
    for _ in range(40):
        w.poll()
    kept = w.samples["svc-r0"]
    assert kept[-1].at_s - kept[0].at_s <= 30.0 + 2 * 3


def test_cli_errors_are_named_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from k3deploy.cli import build_app
    from k3deploy.cli.common import run_app

    for argv, said in ((["top", "svc", "--json"], "--json prints one report: give --once with it"),
                       (["top", "nosuch", "--state-dir", str(tmp_path)], "no deployment or service named 'nosuch'")):
        monkeypatch.setattr(sys, "argv", ["k3deploy", *argv])
        assert run_app(build_app("top")) == 2
        assert said in capsys.readouterr().err
