"""The three `--html` reports as a person sees them: each generated from real inputs (`plan` of a shipped
topology, `plan --search --workload`, and validate's report model), opened in headless Chromium, screenshotted
and read back: the chart's labels and text alternative are in the page the browser built, the chart's colours
are in the screenshot, and the browser's net log shows no request leaving the machine. Without the `report`
extra, `--html` exits 6 naming the install; without it, `plan` never imports matplotlib."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.arith import GIB
from k3deploy.planning.files import plan_path
from tests.browser import (
    NO_BROWSER,
    browser,
    colour_pixels,
    hex_rgb,
    keep_screenshot,
    open_page,
    remote,
    texts,
)
from tests.cli_imports import imported_by
from tests.k3deploy_cli import ROOT, run_k3deploy

pytestmark = pytest.mark.timeout(180)
needs_browser = pytest.mark.skipif(browser() is None, reason=NO_BROWSER)
TOPOLOGY = "topologies/b300-1x8-sglang.yaml"
WORKLOAD = "in=8192,out=1024,concurrency=16"
BLUE, ORANGE, SKY, VERMILION = "#0072B2", "#E69F00", "#56B4E9", "#D55E00"  # charts.PALETTE's first colours


def _html(path: Path) -> str:
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in text
    assert "@media print" in text
    # No URL at all but SVG's own XML namespaces (identifiers, never fetched).
    urls = set(re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"'<>)]*", text))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    return text


@needs_browser
def test_the_browsers_net_log_sees_a_page_that_does_load_remotely(tmp_path: Path) -> None:
    """The control for the no-request checks below: a page that asks for a remote image shows in the log."""
    page = tmp_path / "control.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png"><p>control</p></body></html>')
    shot = open_page(page, tmp_path / "control.png", 400, 300)
    assert remote(shot.requests) == ["http://127.0.0.1:9/x.png"]
    assert "control" in texts(shot.dom).page


@needs_browser
def test_plan_html_draws_the_budget_stack_and_the_prediction_with_its_band(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    plain = run_k3deploy("plan", TOPOLOGY, "--workload", WORKLOAD)
    done = run_k3deploy("plan", TOPOLOGY, "--workload", WORKLOAD, "--html", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout  # the terminal report is unchanged
    _html(out)
    assert not list(tmp_path.glob(".plan.html.*"))  # the atomic write left no temporary file
    shot = open_page(out, tmp_path / "plan.png", 1000, 1650)
    seen = texts(shot.dom)
    plan = plan_path(Path(ROOT / TOPOLOGY), load_catalog()).plan
    assert plan is not None and plan.memory is not None
    from k3deploy.plan_report.report_tables import budget_rows

    for name, n, _how in budget_rows(plan):  # every line item is a legend label and a table row, bytes and GiB
        assert f"{name}: {n / GIB:,.2f} GiB" in seen.chart, (name, seen.chart)
        assert f"{name} {n / GIB:,.2f} {n:,}" in seen.page
    usable = plan.memory.usable_bytes
    assert f" usable {usable / GIB:,.2f} GiB" in seen.chart and "GiB per GPU" in seen.chart
    assert f"usable {usable / GIB:,.2f} {usable:,} the line items sum to this" in seen.page
    doc = json.loads(run_k3deploy("plan", TOPOLOGY, "--workload", WORKLOAD, "--json").stdout)
    low, high = doc["prediction"]["band"]["mean_tpot_ms"]
    assert any(t.strip().startswith("band calibrated ±27%: ") and t.endswith(f"{low:,.2f}-{high:,.2f} ms")
               for t in seen.chart), seen.chart
    assert f"TPOT {doc['prediction']['mean_tpot_ms']:,.2f} ms:" in " ".join(seen.alt)
    assert any("per-GPU memory budget" in a for a in seen.alt)  # the charts' text alternatives
    assert colour_pixels(shot.png, hex_rgb(BLUE)) > 5000  # the routed experts' segment, 63% of the bar
    assert colour_pixels(shot.png, hex_rgb(VERMILION)) > 1000  # free after the pools
    assert colour_pixels(shot.png, hex_rgb(ORANGE)) > 5000  # non-expert weights, and TTFT's queue term
    assert remote(shot.requests) == []
    keep_screenshot(shot, "plan.png")


@needs_browser
def test_search_html_draws_the_pareto_front_with_the_ranked_shapes_marked(tmp_path: Path) -> None:
    out = tmp_path / "search.html"
    argv = ("plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", WORKLOAD)
    plain = run_k3deploy(*argv)
    done = run_k3deploy(*argv, "--html", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    _html(out)
    ranked = json.loads(run_k3deploy(*argv, "--json").stdout)
    first = ranked["shapes"][0]
    name = "/".join([f"TP{first['tp']}", *(f"{k.upper()}{first[k]}" for k in ("ep", "dp", "pp", "dcp") if first[k] > 1)])
    shot = open_page(out, tmp_path / "search.png", 1000, 760)
    seen = texts(shot.dom)
    assert f"#1 {name}" in seen.chart and "Pareto front (shape @ concurrency)" in seen.chart
    assert "output tok/s per GPU (log scale)" in seen.chart and "output tok/s per user (1 / TPOT, log scale)" in seen.chart
    assert any(t.startswith("ranked #2 ") for t in seen.chart)
    tpot = first["prediction"]["mean_tpot_ms"]
    per_gpu = first["prediction"]["output_throughput_per_gpu"]
    # The ranking's first at the asked concurrency, on the table and the front's description.
    assert f"1 {name} " in seen.page and f"{1000 / tpot:,.1f} {per_gpu:,.1f} yes" in seen.page
    assert f"{name} at concurrency 16: {per_gpu:,.1f} per GPU" in " ".join(seen.alt)
    assert colour_pixels(shot.png, hex_rgb(BLUE)) > 300  # the front's line
    assert colour_pixels(shot.png, hex_rgb(ORANGE)) > 40  # the star
    assert colour_pixels(shot.png, hex_rgb(SKY)) > 200  # the shapes at the asked concurrency
    assert remote(shot.requests) == []
    keep_screenshot(shot, "search.png")


def _effort(shift: float) -> tuple[dict[str, Any], str]:
    """The effort stage's results as a run of local-demo measures them: its load's summary (validate's own
    `summarize` of streamed records, TPOT and TTFT spread around the prediction) held against the prediction by
    validate's own `compare`."""
    from k3deploy.planning.prediction import predict_topology
    from k3deploy.planning.workload import Workload
    from k3deploy.validate.loadgen import LoadRun, summarize
    from k3deploy.validate.predicted import compare
    from k3deploy.validate.stage import NodeRef, ValidateContext
    from k3deploy.validate.stages.effort import _line
    from k3deploy.validate.streamed import StreamRecord

    plan = plan_path(ROOT / "topologies/local-demo.yaml", load_catalog()).plan
    assert plan is not None
    t = plan.topology
    ctx = ValidateContext(name=t.name, topology=t, model=plan.model, nodes=[NodeRef(0, "localhost")],  # type: ignore[arg-type]
                          fleet=None)  # type: ignore[arg-type]
    prompts, out_tokens = 8, 120
    f = predict_topology(t, load_catalog(), Workload(1000, out_tokens, t.validate_.concurrency,
                                                      num_prompts=prompts)).bench_fields()

    def record(i: int, hit: bool) -> StreamRecord:
        ttft = f["mean_ttft_ms"] / 1000 * (0.6 + 0.1 * i) * (0.5 if hit else 1.0)
        gap = f["mean_tpot_ms"] / 1000 * (shift + 0.05 * i)
        times = [ttft]
        for k in range(1, out_tokens):  # every seventh token a little late, as a batch's prefill stalls it
            times.append(times[-1] + gap * (1.6 if k % 7 == 0 else 0.9))
        return StreamRecord(deltas=["x"] * out_tokens, token_times_s=times, first_answer_s=times[90],
                            usage={"prompt_tokens": 1000, "completion_tokens": out_tokens,
                                   "prompt_tokens_details": {"cached_tokens": 512 if hit else 0}},
                            latency_s=times[-1])

    cold = summarize(LoadRun([record(i, False) for i in range(prompts)], 3.0), 1)
    hit = summarize(LoadRun([record(i, True) for i in range(prompts)], 2.5), 1)
    _problems, vs, predicted_line = compare(ctx, cold, prompts)
    evidence = "\n".join([_line("cold", cold), _line("prefix_hit", hit), predicted_line])
    return {"reasoning_effort": "low", "max_concurrency": t.validate_.concurrency, "num_prompts": prompts,
            "cold": cold, "prefix_hit": hit, **vs}, evidence


@needs_browser
def test_validate_html_shows_each_instance_and_effort_against_the_prediction(tmp_path: Path) -> None:
    from k3deploy.html_report.page import write_page
    from k3deploy.html_report.validate_page import validate_page
    from k3deploy.validate.pipeline import Report
    from k3deploy.validate.stage import StageResult
    from k3deploy.verdicts.model import NodeRow

    effort, evidence = _effort(1.1)
    stages = [
        StageResult(name="shards[r0]", status="pass", detail="4 shards verified on 1 node", seconds=0.4,
                    nodes=[NodeRow(rank=0, host="10.0.0.1", status="pass", detail="4 of 4 shards match")]),
        StageResult(name="shards[r1]", status="fail", detail="shard 00002 is 4,096 bytes short on node 0",
                    seconds=0.5, evidence="model-00002-of-00004.safetensors: 4,096 bytes short",
                    nodes=[NodeRow(rank=0, host="10.0.0.2", status="fail", detail="shard 00002: 4,096 bytes short",
                                   fix="copy the checkpoint again", problems=["shard 00002: 4,096 bytes short"])]),
        StageResult(name="effort", status="pass", detail="effort low, concurrency 4; served by svc-r0 x5, svc-r1 x3",
                    seconds=6.2, evidence=evidence, results={**effort, "served_by": {"svc-r0": 5, "svc-r1": 3}}),
    ]
    report = Report(deployment="svc", passed=False, exit_code=1, stages=stages)
    out = tmp_path / "validate.html"
    write_page(out, validate_page(report))
    _html(out)
    shot = open_page(out, tmp_path / "validate.png", 1000, 2100)
    seen = texts(shot.dom)
    assert "instance r0: its nodes" in seen.page and "instance r1: its nodes" in seen.page
    assert "through the router: the requests" in seen.page
    assert "copy the checkpoint again" in seen.page and "model-00002-of-00004.safetensors: 4,096 bytes short" in seen.page
    assert evidence.splitlines()[-1] in seen.page  # the prediction's line of the evidence
    assert "svc-r0 5" in seen.page and "svc-r1 3" in seen.page
    assert {"TTFT ms", "TPOT ms", "ITL ms", "cold", "prefix hit", "predicted mean", "prediction band"} <= set(seen.chart)
    cold, predicted = effort["cold"], effort["predicted"]
    rel = predicted["band"]["rel"]
    tpot = predicted["mean_tpot_ms"]
    row = (f"TPOT cold {cold['mean_tpot_ms']:,.2f} {cold['median_tpot_ms']:,.2f} {cold['p90_tpot_ms']:,.2f} "
           f"{cold['p99_tpot_ms']:,.2f} {cold['std_tpot_ms']:,.2f} {tpot:,.2f} {tpot / (1 + rel):,.2f}-{tpot * (1 + rel):,.2f}")
    assert row in seen.page, seen.page
    hit = effort["prefix_hit"]  # the prediction is the cold run's: the prefix-hit run is not held against it
    assert f"TPOT prefix hit {hit['mean_tpot_ms']:,.2f} {hit['median_tpot_ms']:,.2f} {hit['p90_tpot_ms']:,.2f} " \
        f"{hit['p99_tpot_ms']:,.2f} {hit['std_tpot_ms']:,.2f} - -" in seen.page
    assert f"cold p50 {cold['median_ttft_ms']:,.1f}, p90 {cold['p90_ttft_ms']:,.1f}" in " ".join(seen.alt)
    assert colour_pixels(shot.png, hex_rgb(BLUE)) > 500  # cold's boxes
    assert colour_pixels(shot.png, hex_rgb(ORANGE)) > 500  # prefix hit's
    assert remote(shot.requests) == []
    keep_screenshot(shot, "validate.png")


def test_validate_html_from_the_command_line(tmp_path: Path, checkpoint: Path) -> None:
    """`validate --html` writes the report of the run it printed (shards on two local nodes)."""
    import yaml

    from tests.validate_nodes import topology_file

    path = topology_file(tmp_path, "v", 2, str(checkpoint))
    doc = yaml.safe_load(path.read_text())
    doc["nodes"] = [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(2)]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "v.html"
    done = run_k3deploy("validate", path, "--only", "shards", "--json", "--html", out, timeout_s=100)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    text = _html(out)
    assert f"k3deploy validate {report['deployment']}: PASSED" in text
    assert all(n["detail"] in text for n in report["stages"][0]["nodes"] if "<" not in n["detail"])


# `k3deploy ARGV` in an interpreter where matplotlib cannot be found (a path hook that hides it).
HIDDEN = """
import sys
base = next(h for h in sys.path_hooks if 'FileFinder' in getattr(h, '__qualname__', ''))
class Hidden:
    def __init__(self, path):
        self.finder = base(path)
    def find_spec(self, name, target=None):
        return None if name.partition('.')[0] == 'matplotlib' else self.finder.find_spec(name, target)
    def invalidate_caches(self):
        self.finder.invalidate_caches()
sys.path_hooks.insert(0, Hidden)
sys.path_importer_cache.clear()
sys.modules.pop('matplotlib', None)
sys.argv = ['k3deploy'] + sys.argv[1:]
from k3deploy.cli import main
main()
"""


@pytest.mark.parametrize("argv", [("plan", TOPOLOGY), ("validate", "no-such-deployment")])
def test_without_the_report_extra_html_exits_6_naming_the_install(tmp_path: Path, argv: tuple[str, ...]) -> None:
    out = tmp_path / "r.html"
    done = subprocess.run([sys.executable, "-c", HIDDEN, *argv, "--html", str(out)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 6, done.stdout + done.stderr
    assert "--html needs matplotlib" in done.stderr and "[report]'" in done.stderr, done.stderr
    assert not out.exists()


def test_plan_without_html_never_imports_matplotlib() -> None:
    assert imported_by(["plan", TOPOLOGY, "--workload", WORKLOAD], ["matplotlib"]) == []
    assert imported_by(["plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", WORKLOAD],
                       ["matplotlib"]) == []


def test_search_html_without_a_workload_is_exit_2(tmp_path: Path) -> None:
    done = run_k3deploy("plan", "--search", "--hardware", "b300", "--gpus", "8", "--html", tmp_path / "s.html")
    assert done.returncode == 2 and "it needs --workload" in done.stderr, done.stderr


def test_plan_html_of_roles_and_of_an_invalid_file(tmp_path: Path) -> None:
    """Prefill/decode roles: each role's budget drawn, the service predicted per role as the terminal shows it; a
    file that does not load: its issues, exit 2 as ever."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {id: nope}\n")
    out = tmp_path / "roles.html"
    done = run_k3deploy("plan", "topologies/pd-h200-1p1d-sglang.yaml", bad, "--html", out, "--workload", WORKLOAD)
    assert done.returncode == 2, done.stderr
    text = _html(out)
    for role in ("prefill", "decode"):
        assert f">{role}: per-GPU memory budget</title>" in text
    for shown in ("32 GPUs: 1 prefill x 16 + 1 decode x 16", "decode role: the decode step, bound by HBM reads",
                  "TTFT (prefill role, queue, transfer)", "over 32 GPUs of both roles"):
        assert shown in text, shown
    assert f"{bad}: <span class=\"fail\">INVALID</span>" in text
    from k3deploy.html_report.page import esc

    issues = plan_path(bad, load_catalog()).issues
    assert issues and all(esc(i.render(str(bad))) in text for i in issues)  # every issue, as the terminal says it


def test_search_html_of_a_roles_topology_draws_its_layouts(tmp_path: Path) -> None:
    """`plan FILE --search --workload --html` on a topology with roles: the layouts' Pareto front at the asked
    concurrency and the ranking as `--json` gives it, first row first, every layout that does not fit with its
    reason; the terminal output unchanged."""
    argv = ("plan", "topologies/pd-h200-1p1d-sglang.yaml", "--search", "--workload", "in=8192,out=1024,concurrency=8")
    out = tmp_path / "layouts.html"
    plain, done = run_k3deploy(*argv), run_k3deploy(*argv, "--html", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout
    text = _html(out)
    doc = json.loads(run_k3deploy(*argv, "--json").stdout)
    from k3deploy.html_report.page import esc

    first = doc["layouts"][0]
    assert esc(doc["why"]) in text and "Pareto front (layout @ concurrency)" in text and "<svg" in text
    assert f"{first['prediction']['output_throughput_per_gpu']:,.1f}" in text
    refused = [x for x in doc["layouts"] if not x["feasible"]]
    assert refused and all(esc(f"does not fit: {x['reason']}") in text for x in refused[:20])
    assert text.count("<tr>") >= len(doc["layouts"])


def test_validate_html_of_roles_holds_ttft_to_the_prefill_role_and_tpot_to_the_decode_role() -> None:
    """Behind a PD router the effort stage predicts per role (validate/role_effort.py): the page draws TTFT against
    the prefill role's prediction, TPOT and ITL against the decode role's, with its band."""
    from k3deploy.html_report.validate_page import predicted_ms, validate_page
    from k3deploy.validate.pipeline import Report
    from k3deploy.validate.role_effort import RoleEffortStage
    from k3deploy.validate.stage import NodeRef, StageResult, ValidateContext

    plan = plan_path(ROOT / "topologies/pd-h200-1p1d-sglang.yaml", load_catalog()).plan
    assert plan is not None
    t = plan.topology
    ctx = ValidateContext(name=t.name, topology=t, model=plan.model, nodes=[NodeRef(0, "h0")],  # type: ignore[arg-type]
                          fleet=None)  # type: ignore[arg-type]
    cold = {"completed": 8, "total_input_tokens": 8 * 4000, "total_output_tokens": 8 * 500, "mean_ttft_ms": 900.0,
            "median_ttft_ms": 850.0, "p90_ttft_ms": 1200.0, "p99_ttft_ms": 1400.0, "std_ttft_ms": 200.0,
            "mean_tpot_ms": 30.0, "median_tpot_ms": 29.0, "p90_tpot_ms": 35.0, "p99_tpot_ms": 40.0,
            "std_tpot_ms": 4.0, "mean_itl_ms": 30.0, "median_itl_ms": 28.0, "p90_itl_ms": 45.0, "p99_itl_ms": 80.0,
            "std_itl_ms": 9.0}
    _problems, results, _evidence = RoleEffortStage(t).judge(ctx, cold, 8)
    roles = results["predicted_per_role"]
    got = predicted_ms({"cold": cold, **results})
    rel = roles["band"]["rel"]
    assert got["tpot"] == pytest.approx((roles["decode"]["mean_tpot_ms"], roles["decode"]["mean_tpot_ms"] / (1 + rel),
                                         roles["decode"]["mean_tpot_ms"] * (1 + rel)))
    assert got["itl"] == got["tpot"]
    assert got["ttft"] is not None and got["ttft"][0] == roles["prefill"]["mean_ttft_ms"]
    page = validate_page(Report(deployment=t.name, passed=True, exit_code=0, stages=[
        StageResult(name="effort", status="pass", detail="d", results={"cold": cold, **results})]))
    assert f"TPOT cold 30.00 29.00 35.00 40.00 4.00 {got['tpot'][0]:,.2f} " in " ".join(
        re.sub(r"<[^>]+>", " ", page).split())
