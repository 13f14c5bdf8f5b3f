"""`plan FILE --workload` (predicted TTFT/TPOT/throughput, term by term) and `plan --search --workload` (shapes
ranked by the prediction): output, JSON field names, mistakes, and what they import."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.errors import InputError
from k3deploy.planning.files import plan_path
from k3deploy.planning.prediction import predict_plan
from k3deploy.planning.workload import Workload, parse_workload
from tests.cli_imports import imported_by
from tests.unit.plan_helpers import topology_dict
from tests.unit.test_plan_cli import ROOT, k3

pytestmark = pytest.mark.timeout(120)
B300 = ROOT / "topologies" / "b300-1x8-sglang.yaml"
LOAD = "in=8192,out=1024,concurrency=16,effort=high"
BENCH_FIELDS = {"max_concurrency", "num_prompts", "total_input_tokens", "total_output_tokens", "duration",
                "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "mean_tpot_ms",
                "mean_itl_ms", "mean_e2el_ms"}


def test_parse_workload() -> None:
    assert parse_workload(" in=8192, out=1_024,concurrency=16,effort=high ") == Workload(8192, 1024, 16, "high")
    assert parse_workload("in=10,out=2,concurrency=3,prompts=7").prompts == 7
    assert parse_workload("in=10,out=2,concurrency=3").prompts == 15  # 5 x concurrency, the cookbooks'


@pytest.mark.parametrize("text, says", [
    ("in=8192,concurrency=16", "missing out="),
    ("in=8192,out=1024,concurrency=16,effort=medium", "effort='medium': expected one of low, high, max"),
    ("in=8192,out=1,concurrency=16", "out='1': expected a whole number from 2"),
    ("in=lots,out=10,concurrency=16", "in='lots': expected a whole number"),
    ("in=8192,out=1024,users=16", "'users=16' is not one of in=, out=, concurrency="),
    ("in=1,in=2,out=3,concurrency=1", "'in' given twice"),
])
def test_workload_mistakes_name_the_part(text: str, says: str) -> None:
    with pytest.raises(InputError, match=__import__("re").escape(says)):
        parse_workload(text)


def test_json_prediction_uses_vllm_bench_serve_names_and_matches_the_library() -> None:
    r = k3("plan", "--json", B300, "--workload", LOAD)
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)["prediction"]
    assert BENCH_FIELDS <= set(pred) and pred["max_concurrency"] == 16 and pred["num_prompts"] == 80
    cat = load_catalog()
    p = predict_plan(plan_path(B300, cat).plan, cat, parse_workload(LOAD))  # type: ignore[arg-type]
    assert pred["mean_tpot_ms"] == pytest.approx(p.tpot_s * 1000)
    assert pred["output_throughput"] == pytest.approx(p.output_throughput)
    assert pred["output_throughput_per_gpu"] == pytest.approx(p.output_throughput / 8)
    assert pred["bounds"]["tpot"] == "the decode step, bound by HBM reads"
    assert [t["name"] for t in pred["decode_step_terms"]] == ["HBM reads", "compute", "collectives",
                                                              "per-layer overhead"]
    assert pred["workload"]["effort"] == "high"


def test_plain_json_has_no_prediction_key() -> None:
    r = k3("plan", "--json", B300)
    assert r.returncode == 0 and "prediction" not in json.loads(r.stdout)


def test_text_explains_every_term_and_names_the_bound() -> None:
    r = k3("plan", B300, "--workload", LOAD)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for want in ("TTFT (mean)", "TPOT (mean)", "ITL (mean)", "output tok/s per GPU", "the decode step, bound by HBM",
                 "experts touched", "MLA KV", "KDA state", "all-reduce over 8", "prefill stalls", "93 layers x 33.65 us + ",
                 "requests x 0.35 us a layer"):
        assert want in out, want


def test_an_infeasible_plan_predicts_nothing() -> None:
    r = k3("plan", "--json", ROOT / "tests" / "assets" / "invalid" / "broken-port.yaml", "--workload", LOAD)
    assert r.returncode == 2 and json.loads(r.stdout)["prediction"] is None


@pytest.mark.parametrize("argv, says", [
    (["plan", str(B300), "--workload", "in=1"], "missing out="),
    (["plan", str(B300), "--objective", "latency"], "need --workload"),
    (["plan", str(B300), "--workload", LOAD, "--tpot-max", "20"], "add --search"),
    (["plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", LOAD, "--tpot-max", "0"],
     "expected milliseconds > 0"),
    (["plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", LOAD, "--objective", "cost"],
     "--objective cost: expected throughput or latency"),
    (["plan", str(B300), "--workload", LOAD, "--speculation"], "needs --search and --workload"),
    (["plan", "--search", "--hardware", "b300", "--gpus", "8", "--speculation"], "needs --search and --workload"),
])
def test_option_mistakes_exit_2_with_the_fix(argv: list[str], says: str) -> None:
    r = k3(*argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


def test_a_catalog_missing_a_link_figure_is_named(tmp_path: Path) -> None:
    cat = load_catalog()
    hw = cat.hardware["h100-80gb"].model_dump(exclude={"scaleout_gbps", "scaleout_latency_us"})
    hw["id"] = "h100-no-net"
    hw["sources"] = {k: v for k, v in hw["sources"].items() if not k.startswith("scaleout")}
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "mine.yaml").write_text(yaml.safe_dump({"hardware": [hw]}))
    topo = tmp_path / "t.yaml"
    topo.write_text(yaml.safe_dump(topology_dict(gpu="h100-no-net")))
    r = k3("plan", topo, "--catalog", tmp_path / "cat", "--workload", LOAD)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "hardware h100-no-net has no scaleout_gbps and scaleout_latency_us in the catalog" in r.stderr


def test_search_ranks_by_throughput_and_says_why() -> None:
    r = k3("plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload",
           "in=8192,out=1024,concurrency=64", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ranked = [s for s in doc["shapes"] if s["prediction"]]
    per_gpu = [s["prediction"]["output_throughput_per_gpu"] for s in ranked]
    assert per_gpu == sorted(per_gpu, reverse=True) and len(ranked) >= 10
    assert {(s["tp"], s["dcp"]) for s in ranked[:2]} == {(8, 8)}  # DCP8 shards the MLA KV reads of 64 requests
    # The runner-up is the same shape with whole experts per rank: the busiest EP rank's reads bound it.
    why = doc["why"]
    assert why.startswith("TP8/DCP8 wins with") and "TP8/EP8/DCP8: per output token its HBM reads" in why
    assert all(s["prediction"] is None for s in doc["shapes"][len(ranked):])  # what does not fit comes last


def test_tpot_limit_and_latency_objective_reorder_the_shapes() -> None:
    base = ["plan", "--search", "--hardware", "h100-80gb", "--gpus", "32", "--workload",
            "in=8192,out=1024,concurrency=16", "--json"]
    free = json.loads(k3(*base).stdout)["shapes"]
    limited = json.loads(k3(*base, "--tpot-max", "20").stdout)["shapes"]
    meets = [s["meets_tpot_max"] for s in limited if s["prediction"]]
    assert meets == sorted(meets, reverse=True) and True in meets and False in meets
    assert all(s["prediction"]["mean_tpot_ms"] <= 20 for s in limited if s["meets_tpot_max"])
    latency = json.loads(k3(*base, "--objective", "latency").stdout)["shapes"]
    uncapped = [s for s in latency if s["prediction"] and s["prediction"]["capped_by"] is None]
    tpots = [s["prediction"]["mean_tpot_ms"] for s in uncapped]
    assert tpots == sorted(tpots) and latency[0] in uncapped and free != latency


def test_speculation_ranks_every_fitting_shape_with_each_catalogued_draft_length() -> None:
    base = ["plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", "in=8192,out=1024,concurrency=1",
            "--json"]
    plain, spec = json.loads(k3(*base).stdout), json.loads(k3(*base, "--speculation").stdout)
    assert not plain["speculation"] and {s["draft_tokens"] for s in plain["shapes"]} == {0}
    fits = [(s["tp"], s["ep"], s["dp"], s["dcp"]) for s in plain["shapes"] if s["prediction"]]
    drafted = [(s["tp"], s["ep"], s["dp"], s["dcp"], s["draft_tokens"]) for s in spec["shapes"] if s["prediction"]]
    assert sorted(d[:4] for d in drafted if d[4] == 0) == sorted(fits)
    for n in (3, 7):  # the catalog's {3: 3.0, 7: 3.84}; the draft's weights and state slots take room
        with_draft = {d[:4] for d in drafted if d[4] == n}
        no_room = {(s["tp"], s["ep"], s["dp"], s["dcp"]) for s in spec["shapes"]
                   if s["draft_tokens"] == n and s["prediction"] is None}
        assert with_draft and with_draft | no_room == set(fits) and not with_draft & no_room, n
    assert spec["why"].startswith("TP8/DSPARK7 wins with") and spec["shapes"][0]["draft_tokens"] == 7
    text = k3(*base[:-1], "--speculation").stdout
    assert "TP8/DSPARK7" in text and "--speculative-dspark-block-size n" in text


def test_text_search_lists_shapes_and_the_winner() -> None:
    r = k3("plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", "in=8192,out=1024,concurrency=64")
    assert r.returncode == 0, r.stderr
    assert "ranked by throughput" in r.stdout and "TP8/DCP8 wins with" in r.stdout and "does not fit" in r.stdout


@pytest.mark.parametrize("argv", [
    ["plan", "topologies/b300-1x8-sglang.yaml", "--workload", LOAD],
    ["plan", "topologies/pd-h200-1p1d-sglang.yaml", "--workload", LOAD],
    ["plan", "--search", "--hardware", "b300", "--gpus", "8", "--workload", LOAD],
])
def test_workload_imports_no_heavy_modules(argv: list[str]) -> None:
    assert imported_by(argv, ["torch", "ray", "paramiko", "httpx"]) == []


def test_json_workload_draws_no_tables() -> None:
    assert imported_by(["plan", "--json", "topologies/b300-1x8-sglang.yaml", "--workload", LOAD],
                       ["rich.console", "rich.table"]) == []


def test_text_says_an_infeasible_plan_gets_no_prediction(tmp_path: Path) -> None:
    topo = tmp_path / "small.yaml"
    topo.write_text(yaml.safe_dump(topology_dict(nodes=1, tp=8, ep=8)))  # K3 on one H100 node does not fit
    r = k3("plan", topo, "--workload", LOAD)
    assert r.returncode == 1 and "no prediction for --workload: the plan is not feasible" in r.stdout


def test_speculation_as_engine_args_configure_it() -> None:
    from k3deploy.planning.perf_model import PerfUnknown
    from k3deploy.planning.speculation import acceptance, draft_tokens, pinned_acceptance, replay_ring_len

    assert draft_tokens({}) == 0 and draft_tokens({"--speculative-algorithm": None}) == 0
    assert draft_tokens({"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}) == 7
    assert draft_tokens({"--speculative-config": '{"method": "dspark", "num_speculative_tokens": 3}'}) == 3
    for args, says in (({"--speculative-algorithm": "EAGLE"}, "only DSPARK"),
                       ({"--speculative-algorithm": "DSPARK"}, "set it"),
                       ({"--speculative-config": "{nope"}, "not JSON"),
                       ({"--speculative-config": '{"method": "x"}'}, "no num_speculative_tokens")):
        with pytest.raises(PerfUnknown, match=says):
            draft_tokens(args)
    k3 = load_catalog().models["kimi-k3"]
    assert acceptance(k3, 0) == 1.0 and acceptance(k3, 7) == 3.84
    with pytest.raises(PerfUnknown, match=r"no draft_acceptance_length for 5 draft tokens .*known: 3, 7"):
        acceptance(k3, 5)
    env = "SGLANG_SIMULATE_ACC_LEN"
    assert pinned_acceptance(env, {env: "4.5"}, 7) == 4.5 and pinned_acceptance(env, {}, 7) is None
    assert pinned_acceptance(env, {env: "4.5"}, 0) is None and pinned_acceptance(None, {env: "4.5"}, 7) is None
    for bad in ("9", "0.5", "lots"):
        with pytest.raises(PerfUnknown, match=f"engine.env {env}='{bad}': expected a number from 1 to 8"):
            pinned_acceptance(env, {env: bad}, 7)
    ring = load_catalog().engines["sglang"].replay_ring
    on = {"--enable-linear-replayssm-spec": True}
    assert replay_ring_len({}, ring) == 0 and replay_ring_len(on, None) == 0 and replay_ring_len(on, ring) == 16
    assert replay_ring_len({**on, "--linear-replayssm-cache-len": 32}, ring) == 32


def test_dspark_speeds_decode_by_its_acceptance(tmp_path: Path) -> None:
    plain, spec = tmp_path / "plain.yaml", tmp_path / "spec.yaml"
    doc = topology_dict(gpu="b300", nodes=1, tp=8, ep=1)
    plain.write_text(yaml.safe_dump(doc))
    doc["engine"]["args"] = {"--speculative-algorithm": "DSPARK", "--speculative-dspark-block-size": 7}
    spec.write_text(yaml.safe_dump(doc))
    one = "in=8192,out=1024,concurrency=1"
    a, b = (json.loads(k3("plan", "--json", f, "--workload", one).stdout)["prediction"] for f in (plain, spec))
    assert 2.5 < a["mean_tpot_ms"] / b["mean_tpot_ms"] < 3.84  # 3.84 kept per verify of 8 tokens, which reads more
    doc["engine"]["env"] = {"SGLANG_SIMULATE_ACC_LEN": "4.5"}  # a benchmark's pinned acceptance is the one kept
    spec.write_text(yaml.safe_dump(doc))
    c = json.loads(k3("plan", "--json", spec, "--workload", one).stdout)["prediction"]
    assert c["mean_tpot_ms"] == pytest.approx(b["mean_tpot_ms"] * 3.84 / 4.5, rel=1e-6)
    doc["engine"]["env"] = {"SGLANG_SIMULATE_ACC_LEN": "9"}
    spec.write_text(yaml.safe_dump(doc))
    r = k3("plan", spec, "--workload", one)
    assert r.returncode == 2 and "SGLANG_SIMULATE_ACC_LEN='9': expected a number from 1 to 8" in r.stderr
    doc["engine"]["env"] = {}
    doc["engine"]["args"]["--speculative-dspark-block-size"] = 5
    spec.write_text(yaml.safe_dump(doc))
    r = k3("plan", spec, "--workload", one)
    assert r.returncode == 2 and "no draft_acceptance_length for 5 draft tokens" in r.stderr


def test_a_model_the_performance_model_cannot_time_is_said_so_not_divided_by_zero() -> None:
    """A dense GQA model (the real-engine tier's tiny Llama: 0 routed experts) raised ZeroDivisionError (exit 70)
    in `plan --search --workload` and in validate's effort stage; it is now PerfUnknown, said by name."""
    from k3deploy.catalog.loader import load_catalog as load
    from k3deploy.planning.perf_model import PerfUnknown
    from k3deploy.planning.prediction import predict_topology
    from k3deploy.planning.workload import Workload
    from k3deploy.topology.loader import load_topology

    root = Path(__file__).resolve().parents[2]
    catalog = load((root / "tests" / "assets" / "catalog",))
    doc = {"name": "dense", "model": {"id": "tiny-llama", "path": "/m"}, "hardware": {"gpu": "cpu-host",
           "gpus_per_node": 1}, "engine": {"kind": "vllm"}, "parallel": {"tp": 1},
           "serving": {"context_length": 2048, "max_running_requests": 4},
           "nodes": [{"host": "h01", "ip": "10.0.0.1", "iface": "eth0"}]}
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "t.yaml"
        f.write_text(yaml.safe_dump(doc))
        topo = load_topology(f).topology
    with pytest.raises(PerfUnknown, match="MLA \\+ MoE models like K3; this one is GQA with 0 routed experts"):
        predict_topology(topo, catalog, Workload(input_tokens=512, output_tokens=64, concurrency=4))


PD = ROOT / "topologies" / "pd-h200-1p1d-sglang.yaml"
PD_SIM = ROOT / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"  # `sim` has no scale-out figures


def test_roles_are_predicted_per_role_in_text_and_json() -> None:
    """A prefill/decode topology: the service through both roles (planning/pd_prediction.py), not the decode
    instance's shape as one deployment; each figure names the role that bounds it; the JSON is the library's."""
    from k3deploy.planning.pd_prediction import predict_roles

    load = "in=8192,out=1024,concurrency=8"
    text = k3("plan", PD, "--workload", load)
    assert text.returncode == 0, text.stderr
    for want in ("32 GPUs: 1 prefill x 16 + 1 decode x 16", "prefill role: the prefill, bound by",
                 "decode role: the decode step, bound by HBM reads", "of its rate decoding 8 requests an instance",
                 "over 32 GPUs of both roles", "TTFT (prefill role, queue, transfer)", "decode role: decode step",
                 "MLA KV and KDA state per GPU over scale-out", "prefill role: prefill of 8,192 tokens"):
        assert want in text.stdout, want
    assert "prefill stalls" not in text.stdout  # the decode role never prefills
    r = k3("plan", "--json", PD, "--workload", load)
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)["prediction"]
    cat = load_catalog()
    p = predict_roles(plan_path(PD, cat).plan.topology, cat, parse_workload(load))  # type: ignore[union-attr]
    assert p.ttft_s is not None
    assert pred["mean_ttft_ms"] == pytest.approx(p.ttft_s * 1000) == pred["prefill"]["mean_ttft_ms"]
    assert pred["mean_tpot_ms"] == pytest.approx(p.tpot_s * 1000) == pred["decode"]["mean_tpot_ms"]
    assert pred["output_throughput_per_gpu"] == pytest.approx(p.output_throughput / 32) and pred["gpus"] == 32
    assert [t["name"] for t in pred["prefill"]["terms"]] == ["prefill role: prefill", "queue", "transfer"]
    assert pred["bounds"]["output_throughput"].startswith("the decode role (")
    assert pred["band"]["kind"] == "extrapolated" and pred["band"]["mean_tpot_ms"][0] < pred["mean_tpot_ms"]
    for row in ("TPOT (mean)", "output tok/s ", "output tok/s per GPU"):  # each with its band in the table
        line = next(x for x in text.stdout.splitlines() if x.strip().startswith(row))
        assert re.search(r"\d-[\d,.]+( ms)?\s+\S", line), line


def test_roles_whose_transfer_cannot_be_timed_say_so() -> None:
    """In-process (the command's path is the test above): the table and the document `plan` prints."""
    from rich.console import Console

    from k3deploy.plan_report.perf_report import prediction_renderable
    from k3deploy.planning.pd_prediction import predict_roles, prediction_document

    cat = load_catalog()
    p = predict_roles(plan_path(PD_SIM, cat).plan.topology, cat,  # type: ignore[union-attr]
                      parse_workload("in=1000,out=200,concurrency=4"))
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(prediction_renderable(p))
    text = console.export_text()
    assert "not predicted: the transfer cannot be timed" in text and "TTFT (prefill role, queue; the transfer" in text
    assert "TTFT not predicted: hardware sim has no scaleout_gbps" in text
    pred = prediction_document(p)
    assert pred["mean_ttft_ms"] is None and "no scaleout_gbps" in pred["prefill"]["not_timed"]
    assert pred["mean_tpot_ms"] > 0 and "transfer" not in [t["name"] for t in pred["prefill"]["terms"]]


PD = ROOT / "topologies" / "pd-h200-1p1d-sglang.yaml"
PD_LOAD = "in=8192,out=1024,concurrency=8"


def test_search_of_a_roles_topology_ranks_its_prefill_decode_layouts() -> None:
    """`plan FILE --search --workload` on a topology with roles: one row per prefill shape and decode shape over
    each role's 16 GPUs, ranked by output tok/s per GPU of both roles; the file's own layout predicted as `plan FILE
    --workload` predicts it; what does not fit last, each with its reason and code; the table shows the same."""
    r = k3("plan", PD, "--search", "--workload", PD_LOAD, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["file"], doc["hardware"], doc["gpus"], doc["objective"]) == (str(PD), "h200",
                                                                           {"prefill": 16, "decode": 16}, "throughput")
    rows = doc["layouts"]
    ranked = [x for x in rows if x["prediction"]]
    assert len(ranked) >= 50 and rows[:len(ranked)] == ranked  # what does not fit or is not timed comes last
    per_gpu = [x["prediction"]["output_throughput_per_gpu"] for x in ranked]
    assert per_gpu == sorted(per_gpu, reverse=True)
    for x in rows:
        for role in ("prefill", "decode"):
            s = x[role]
            assert set(s) == {"tp", "ep", "dp", "pp", "dcp", "attn_tp"} and s["tp"] * s["pp"] == 16, x
    refused = [x for x in rows if not x["feasible"]]
    assert refused and all(x["reason"] and x["code"] and x["prediction"] is None for x in refused)
    assert {"PD_SGLANG_PP", "decode MEM_WEIGHTS"} <= {x["code"] for x in refused}  # cross-role rule; a role's plan
    own = next(x for x in ranked if (x["prefill"]["tp"], x["prefill"]["ep"], x["prefill"]["dp"]) == (16, 16, 1)
               and (x["decode"]["tp"], x["decode"]["ep"], x["decode"]["dp"], x["decode"]["dcp"]) == (16, 16, 2, 1))
    plain = json.loads(k3("plan", PD, "--workload", PD_LOAD, "--json").stdout)["prediction"]
    for key in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput_per_gpu"):
        assert own["prediction"][key] == pytest.approx(plain[key]), key
    assert own["prediction"]["band"] == plain["band"]
    top = ranked[0]
    assert doc["why"].startswith(f"prefill TP{top['prefill']['tp']}") and " wins with " in doc["why"]
    latency = json.loads(k3("plan", PD, "--search", "--workload", PD_LOAD, "--json", "--objective", "latency",
                            "--tpot-max", "20").stdout)["layouts"]
    timed = [x for x in latency if x["prediction"]]
    meets = [x["meets_tpot_max"] for x in timed]
    assert meets == sorted(meets, reverse=True) and True in meets and False in meets
    tpots = [x["prediction"]["mean_tpot_ms"] for x in timed if x["meets_tpot_max"]]
    assert tpots == sorted(tpots) and max(tpots) <= 20
    text = k3("plan", PD, "--search", "--workload", PD_LOAD).stdout
    lines = text.splitlines()
    assert f"Prefill/decode layouts of {PD} (16 prefill + 16 decode GPUs), ranked by throughput" in " ".join(
        text.split())
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["prefill", "decode"])
    first = lines[head + 2].split()
    name = "/".join([f"TP{top['prefill']['tp']}", *(f"{k.upper()}{top['prefill'][k]}" for k in ("ep", "dp", "pp", "dcp")
                                                    if top["prefill"][k] > 1)])
    assert first[0] == name and first[4] == f"{top['prediction']['output_throughput_per_gpu']:,.1f}"
    flat = " ".join(text.split())
    assert doc["why"] in flat
    # What does not fit: counted by the code that refuses it, as many as the JSON lists, each code with a reason.
    assert f"{len(refused):,} layouts do not fit" in flat
    for code in {x["code"] for x in refused}:
        example = next(x for x in refused if x["code"] == code)
        count = sum(x["code"] == code for x in refused)
        assert f"{count:,} {code}, e.g. prefill " in flat and example["reason"] in flat, code
    assert len(lines) < len(rows) / 4  # the ranking is not buried under the refused layouts


@pytest.mark.parametrize("argv, says", [
    (["plan", str(PD), "--search"], "it needs exactly one FILE and --workload"),
    (["plan", str(PD), str(PD), "--search", "--workload", PD_LOAD], "it needs exactly one FILE and --workload"),
    (["plan", str(PD), "--search", "--workload", PD_LOAD, "--gpus", "16"], "the FILE's roles give its pool"),
    (["plan", str(PD), "--search", "--workload", PD_LOAD, "--speculation"], "the FILE's roles give its pool"),
    (["plan", str(B300), "--search", "--workload", PD_LOAD], "this one is one deployment"),
    (["plan", str(PD), "--search", "--workload", PD_LOAD, "--objective", "cost"],
     "--objective cost: expected throughput or latency"),
])
def test_search_of_a_file_needs_roles_and_a_workload(argv: list[str], says: str) -> None:
    r = k3(*argv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
