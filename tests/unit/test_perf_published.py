"""The performance model against every published Kimi K3 measurement we cite (tests/assets/perf/published_k3.yaml):
TPOT within +-30% on at least 80% of them and output tok/s per GPU on at least 70% (issue 37's bar), every case
inside its prediction's band, the layouts published for one machine and workload ordered as measured, and the
table's recorded predictions and errors the model's own (K3DEPLOY_REGEN_PERF_CASES=1 rewrites them; review the
diff). Each accelerator family's factors are fitted on the cases marked `calibration`, never on the others."""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.pd_prediction import predict_roles
from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import expert_padding
from k3deploy.planning.prediction import perf_inputs, predict, predict_plan
from k3deploy.planning.ranking import RankedShape, rank_shapes
from k3deploy.planning.role_search import RoleLayout, rank_layouts, search_layouts
from k3deploy.planning.speculation import draft_tokens
from k3deploy.planning.workload import Workload
from k3deploy.topology.loader import parse_topology
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(120)
TABLE = Path(__file__).resolve().parents[1] / "assets" / "perf" / "published_k3.yaml"
REGEN = "K3DEPLOY_REGEN_PERF_CASES"
BAND = 0.30
CASES: list[dict[str, Any]] = yaml.safe_load(TABLE.read_text())["cases"]
KEYS = ("ttft_ms", "tpot_ms", "output_tok_s_per_gpu")


def _pd_doc(case: dict[str, Any]) -> dict[str, Any]:
    """One prefill and one decode instance, each on half the case's nodes, behind a router."""
    w, half = case["workload"], case["nodes"] // 2
    doc = topology_dict(gpu=case["hardware"], per_node=case["gpus_per_node"], nodes=case["nodes"],
                        max_running_requests=w["concurrency"], mamba_full_memory_ratio="calculator")
    names = [n["host"] for n in doc["nodes"]]
    doc.pop("parallel")
    doc["roles"] = {"prefill": {"instances": 1, "nodes": names[:half], "parallel": case["roles"]["prefill"]},
                    "decode": {"instances": 1, "nodes": names[half:], "parallel": case["roles"]["decode"]},
                    "transfer": {"backend": "nixl", "side_channel_port": 15600}}
    doc["router"] = {"kind": "smg", "runs_on": names[half], "port": 30000}
    return doc


@functools.cache
def _predicted(name: str) -> tuple[dict[str, float], Band | None]:
    case = next(c for c in CASES if c["case"] == name)
    w = case["workload"]
    load = Workload(w["in"], w["out"], w["concurrency"])
    if "roles" in case:
        t = parse_topology(yaml.safe_dump(_pd_doc(case), sort_keys=False), "t.yaml").topology
        r = predict_roles(t, load_catalog(), load)
        return ({"ttft_ms": round((r.ttft_s or 0) * 1000, 2), "tpot_ms": round(r.tpot_s * 1000, 2),
                 "output_tok_s_per_gpu": round(r.output_throughput_per_gpu, 2)}, r.band)
    par = case["parallel"]
    doc = topology_dict(gpu=case["hardware"], per_node=case["gpus_per_node"], nodes=case["nodes"],
                        kind=case.get("engine_kind", "sglang"), model=case.get("model", "kimi-k3"), tp=par["tp"],
                        ep=par["ep"], dcp=par["dcp"], dp=par.get("dp", 1), max_running_requests=w["concurrency"],
                        **case.get("serving", {}),
                        # the published SGLang servers ran the cookbook's generated command, its calculator's ratio
                        **({"mamba_full_memory_ratio": "calculator"}
                           if case.get("engine_kind", "sglang") == "sglang" else {}))
    doc["engine"]["args"] = case.get("engine_args", {})
    doc["engine"]["env"] = case.get("engine_env", {})
    plan = plan_of(doc)
    assert plan.feasible, [i.message for i in plan.issues if i.severity == "error"]
    if "acceptance" in case:
        # Drafts accepted as the run measured them (real acceptance, published beside the figures) in place of the
        # catalog's curve: the model times a verify step and divides by what it keeps; it cannot know the prompts'.
        cap = plan.capacity
        assert cap is not None
        inp = perf_inputs(plan, load_catalog())._replace(accepted=case["acceptance"])
        p = predict(inp, load, max_running=cap.max_running_requests, kv_tokens=cap.kv_tokens)
    else:
        p = predict_plan(plan, load_catalog(), load)
    # A published ITL median leaves out the steps a prefill stalls: it is held against the decode step alone.
    tpot = p.decode_step_s if case.get("tpot_is") == "itl_p50" else p.tpot_s
    return ({"ttft_ms": round(p.ttft_s * 1000, 2), "tpot_ms": round(tpot * 1000, 2),
             "output_tok_s_per_gpu": round(p.output_throughput_per_gpu, 2)}, p.band)


def predicted(case: dict[str, Any]) -> dict[str, float]:
    """The model's figures for a case: `plan` of a topology with the case's shape (both roles for PD)."""
    return dict(_predicted(case["case"])[0])


def errors(published: dict[str, float | None], pred: dict[str, float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, name in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("output_tok_s_per_gpu", "output_tok_s_per_gpu")):
        pub = published[key]
        out[name] = None if pub is None else round(pred[key] / pub - 1, 3)
    return out


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:+.0%}"


def table_line(case: dict[str, Any], pred: dict[str, float], err: dict[str, float | None], band: Band | None) -> str:
    """case, source, published, predicted, error, band: one row of the test table."""
    pub = case["published"]
    return (f"{case['case']:<30} TPOT {pub['tpot_ms'] or '-':>6} -> {pred['tpot_ms']:>7} ({_pct(err['tpot'])})  "
            f"out/GPU {pub['output_tok_s_per_gpu']:>6} -> {pred['output_tok_s_per_gpu']:>7} "
            f"({_pct(err['output_tok_s_per_gpu'])})  band {band.label() if band else '-'}  {case['source']}")


def test_every_case_cites_a_source_and_its_published_figures() -> None:
    assert len(CASES) >= 25
    for case in CASES:
        src = case["source"]
        assert src.startswith("https://") or ("/" in src and "@" in src), case["case"]  # a URL, or repo path @ commit
        assert case["as_published"] and set(case["published"]) == set(KEYS), case["case"]
        assert case["published"]["output_tok_s_per_gpu"], case["case"]
    assert len({c["hardware"] for c in CASES}) >= 4
    # Blackwell, CDNA4, CDNA3 and Ascend each calibrated on its own published run; Hopper is held only to the seed's
    # H100 walkthrough (the test below): its published K3 runs are in found_not_used, with why.
    assert {load_catalog().hardware[c["hardware"]].perf_family for c in CASES} >= {"blackwell", "cdna4", "cdna3",
                                                                                   "ascend"}
    assert {c.get("engine_kind", "sglang") for c in CASES} >= {"sglang", "vllm", "vllm-ascend"}
    for c in CASES:  # a measured (unpinned) acceptance is the published one: 1 + drafts x token acceptance
        if "acceptance" in c:
            assert 1 < c["acceptance"] <= 8 and "mean accepted length" in c["as_published"], c["case"]
    assert any("roles" in c for c in CASES)  # disaggregated figures included


def test_the_catalog_is_calibrated_on_the_cases_marked_calibration_only() -> None:
    """Every family's `calibrated_on` names cases marked `calibration`, each such case is named once, and every
    other case is held back: never a factor fitted on a check."""
    named: list[str] = []
    for perf in load_catalog().performance.values():
        for fam in perf.families.values():
            named += fam.calibrated_on
            assert not set(fam.calibrated_on) & set(fam.checked_on)
    marked = [c["case"] for c in CASES if c.get("calibration") and "calibrates" not in c]
    assert sorted(named) == sorted(marked)
    for c in CASES:  # a hardware figure fitted on a published case says so in its source
        if "calibrates" in c:
            hw, field = c["calibrates"].split(".")
            assert load_catalog().hardware[hw].sources[field].startswith("calibrated:"), c["case"]
    assert len(CASES) - sum(1 for c in CASES if c.get("calibration")) >= 25
    cat = load_catalog()
    for c in CASES:  # every other case is one of its family's named checks (the band is taken over them)
        fam = cat.performance[c.get("engine_kind", "sglang")].families[cat.hardware[c["hardware"]].perf_family or ""]
        assert c["case"] in (*fam.calibrated_on, *fam.checked_on) or "calibrates" in c, c["case"]


def test_every_figure_left_out_says_where_and_why() -> None:
    left_out = yaml.safe_load(TABLE.read_text())["found_not_used"]
    assert len(left_out) >= 10
    for entry in left_out:
        assert set(entry) == {"source", "figures", "why"} and entry["source"].startswith("https://"), entry
        assert entry["figures"].strip() and entry["why"].strip(), entry


def test_tpot_and_throughput_within_30_percent_on_most_published_figures() -> None:
    """Issue 37's bar over the held-back cases: TPOT within +-30% on >= 80%, output tok/s per GPU on >= 70%."""
    rows = [(c, predicted(c)) for c in CASES if not c.get("calibration")]
    lines = [table_line(c, p, errors(c["published"], p), _predicted(c["case"])[1]) for c, p in rows]
    print("\n".join(lines))
    tpot = [e for c, p in rows if (e := errors(c["published"], p)["tpot"]) is not None]
    out = [e for c, p in rows if (e := errors(c["published"], p)["output_tok_s_per_gpu"]) is not None]
    assert sum(abs(e) <= BAND for e in tpot) / len(tpot) >= 0.80, lines
    assert sum(abs(e) <= BAND for e in out) / len(out) >= 0.70, lines


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_every_published_figure_lies_inside_its_predictions_band(case: dict[str, Any]) -> None:
    pred, band = _predicted(case["case"])
    assert band is not None
    for key in ("tpot_ms", "output_tok_s_per_gpu"):
        pub = case["published"][key]
        if pub is not None:
            assert band.low(pred[key]) <= pub * 1.0005 and pub <= band.high(pred[key]) * 1.0005, (
                table_line(case, pred, errors(case["published"], pred), band))


def test_recorded_predictions_are_the_models() -> None:
    rows = [(c, predicted(c)) for c in CASES]
    if os.environ.get(REGEN):
        text = TABLE.read_text()
        for c, pred in rows:
            err = errors(c["published"], pred)
            old_p, old_e = _flow(c["predicted"]), _flow(c["error"])
            text = text.replace(f"    predicted: {old_p}\n    error: {old_e}",
                                f"    predicted: {_flow(pred)}\n    error: {_flow(err)}", 1)
        TABLE.write_text(text)
        return
    for c, pred in rows:
        for key, value in pred.items():
            assert value == pytest.approx(c["predicted"][key], rel=0.01), (c["case"], key, pred,
                                                                           f"rerun with {REGEN}=1 and review")
        assert errors(c["published"], pred) == pytest.approx(c["error"], abs=0.011), c["case"]


def _flow(d: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {'null' if v is None else format(v, 'g')}" for k, v in d.items()) + "}"


def test_configurations_published_for_one_workload_rank_as_measured() -> None:
    """Where cases share hardware and workload (B300 with and without DSPARK; GB200's decode layouts; Ascend's two
    DSpark runs, apart by their measured acceptance), the
    predictions order them as the measurements do, on TPOT and on output tok/s per GPU (differences under 5% are
    ties). GB200's EP16-on-DCP16 pair at concurrency 512 included: the benchmark run (planning/pd_prediction.py)
    decodes what has come through the prefill role, so the faster step gives the higher rate."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in CASES:
        w = c["workload"]
        groups.setdefault((c["hardware"], w["in"], w["out"], w["concurrency"], "roles" in c), []).append(c)
    pairs, wrong = 0, set()
    for cases in groups.values():
        for a in cases:
            for b in cases:
                for key in ("tpot_ms", "output_tok_s_per_gpu"):
                    pa, pb = a["published"][key], b["published"][key]
                    if pa is not None and pb is not None and pa > 1.05 * pb:
                        pairs += 1
                        if not predicted(a)[key] > predicted(b)[key]:
                            wrong.add((a["case"], b["case"], key) if key != "tpot_ms" else (b["case"], a["case"], key))
    assert not wrong, sorted(wrong)
    assert pairs >= 20


def _published_groups() -> list[list[dict[str, Any]]]:
    """Aggregated cases that share hardware, GPU count and workload (two or more configurations measured alike)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in CASES:
        # `plan --search` ranks with the catalog's acceptance: runs told apart by their prompts' measured acceptance
        # (Ascend's two DSpark runs, one configuration) are ordered by test_configurations_published_..., not here.
        if "roles" in c or "acceptance" in c:
            continue
        w = c["workload"]
        key = (c["hardware"], c["nodes"] * c["gpus_per_node"], w["in"], w["out"], w["concurrency"])
        groups.setdefault(key, []).append(c)
    return [g for g in groups.values() if len(g) > 1]


def _position(rows: list[RankedShape], case: dict[str, Any]) -> int:
    """Where the case's configuration (shape and draft tokens) lands in a `plan --search --workload` ranking."""
    par, drafts = case["parallel"], draft_tokens(case.get("engine_args", {}))
    for i, r in enumerate(rows):
        s = r.candidate.shape
        if (s.tp, s.ep, s.dcp, s.dp, s.pp, r.drafts) == (par["tp"], par["ep"], par["dcp"], 1, par.get("pp", 1),
                                                         drafts):
            assert r.prediction is not None, (case["case"], r.reason)
            return i
    raise AssertionError(f"{case['case']}: its configuration is not among the searched shapes")


def test_search_ranks_the_configurations_published_for_one_workload_as_measured() -> None:
    """`plan --search --workload --speculation` puts the configuration measured faster above the slower one
    (throughput: output tok/s per GPU; latency: TPOT), for every pair published on one hardware and workload;
    every configuration holds its whole concurrency (the c64 DSPARK run with ReplaySSM's state pool, as measured:
    test_sglang_state_pool.py), so none ranks behind for a cap the measured server did not have."""
    pairs = 0
    for group in _published_groups():
        c0, w = group[0], group[0]["workload"]
        ranked = {objective: rank_shapes(load_catalog(), model_id="kimi-k3", hardware_id=c0["hardware"],
                                         gpus=c0["nodes"] * c0["gpus_per_node"], family="sglang",
                                         engine_id="sglang", workload=Workload(w["in"], w["out"], w["concurrency"]),
                                         objective=objective, speculation=True)  # type: ignore[arg-type]
                  for objective in ("throughput", "latency")}
        for rows in ranked.values():
            for c in group:
                p = rows[_position(rows, c)].prediction
                assert p is not None and p.capped_by is None, (c["case"], p and p.capped_by)
        for a in group:
            for b in group:
                if a["published"]["output_tok_s_per_gpu"] > 1.05 * b["published"]["output_tok_s_per_gpu"]:
                    pairs += 1
                    rows = ranked["throughput"]
                    assert _position(rows, a) < _position(rows, b), (a["case"], b["case"], "throughput")
                if a["published"]["tpot_ms"] < b["published"]["tpot_ms"] / 1.05:
                    pairs += 1
                    rows = ranked["latency"]
                    assert _position(rows, a) < _position(rows, b), (a["case"], b["case"], "latency")
    assert pairs >= 6


def _published_role_groups() -> list[list[dict[str, Any]]]:
    """Prefill/decode cases that share hardware, GPU count and workload (GB200's decode layouts at each
    concurrency)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in CASES:
        if "roles" in c:
            w = c["workload"]
            key = (c["hardware"], c["nodes"] * c["gpus_per_node"], w["in"], w["out"], w["concurrency"])
            groups.setdefault(key, []).append(c)
    return [g for g in groups.values() if len(g) > 1]


def _layout_position(rows: list[RoleLayout], case: dict[str, Any]) -> int:
    """Where the case's prefill and decode shapes land in a `plan FILE --search --workload` ranking."""
    def degrees(par: dict[str, int]) -> tuple[int, ...]:
        return (par["tp"], par.get("ep", 1), par.get("dp", 1), par.get("pp", 1), par.get("dcp", 1))

    want = (degrees(case["roles"]["prefill"]), degrees(case["roles"]["decode"]))
    for i, r in enumerate(rows):
        if tuple((s.tp, s.ep, s.dp, s.pp, s.dcp) for s in (r.prefill, r.decode)) == want:
            assert r.prediction is not None, (case["case"], r.reason)
            return i
    raise AssertionError(f"{case['case']}: its layout is not among the searched ones")


def test_role_layout_search_ranks_the_layouts_published_for_one_workload_as_measured() -> None:
    """`plan FILE --search --workload` on the published GB200 prefill/decode setup (4 prefill + 4 decode nodes of 4,
    prefill PP2 x TP8; sglang#32592) finds every published decode layout among its layouts, predicts each as `plan
    FILE --workload` does, and puts the one measured faster above the slower one, at every published concurrency
    (throughput: output tok/s per GPU of both roles; latency: TPOT; measured differences under 5% are ties). At
    concurrency 8 that is PP2 x TP8 above TP16, DCP16 and DCP16 + EP16, on both."""
    cat, pairs = load_catalog(), 0
    groups = _published_role_groups()
    assert sorted(g[0]["workload"]["concurrency"] for g in groups) == [8, 64, 128, 256, 512]
    for group in groups:
        c0, w = group[0], group[0]["workload"]
        assert all(c["roles"]["prefill"] == c0["roles"]["prefill"] and c["nodes"] == c0["nodes"] for c in group)
        loaded = parse_topology(yaml.safe_dump(_pd_doc(c0), sort_keys=False), "t.yaml")
        rows = search_layouts(loaded, cat, Workload(w["in"], w["out"], w["concurrency"]))
        ranked = {objective: rank_layouts(rows, objective) for objective in ("throughput", "latency")}  # type: ignore[arg-type]
        for c in group:
            p = ranked["latency"][_layout_position(ranked["latency"], c)].prediction
            assert p is not None
            assert (round(p.tpot_s * 1000, 2), round(p.output_throughput_per_gpu, 2)) == (
                predicted(c)["tpot_ms"], predicted(c)["output_tok_s_per_gpu"]), c["case"]
        for a in group:
            for b in group:
                pa, pb = a["published"], b["published"]
                if pa["output_tok_s_per_gpu"] > 1.05 * pb["output_tok_s_per_gpu"]:
                    pairs += 1
                    rows = ranked["throughput"]
                    assert _layout_position(rows, a) < _layout_position(rows, b), (a["case"], b["case"], "throughput")
                if pa["tpot_ms"] is not None and pb["tpot_ms"] is not None and pa["tpot_ms"] < pb["tpot_ms"] / 1.05:
                    pairs += 1
                    rows = ranked["latency"]
                    assert _layout_position(rows, a) < _layout_position(rows, b), (a["case"], b["case"], "latency")
    assert pairs >= 20


def test_one_sources_runs_at_other_concurrencies_order_as_measured() -> None:
    """Within one source, hardware and shape, with the same drafting, the predictions order the runs of other
    concurrencies as measured, on TTFT, TPOT and output tok/s per GPU (measured differences under 5% are ties)."""
    pairs = 0
    for a in CASES:
        for b in CASES:
            same = (a["source"], a["hardware"], a.get("engine_args"), str(a.get("roles") or a["parallel"])) == (
                b["source"], b["hardware"], b.get("engine_args"), str(b.get("roles") or b["parallel"]))
            if not same or a["workload"]["concurrency"] >= b["workload"]["concurrency"]:
                continue
            pa, pb = predicted(a), predicted(b)
            for key in KEYS:
                ma, mb = a["published"][key], b["published"][key]
                if ma is None or mb is None or abs(ma - mb) < 0.05 * max(ma, mb):
                    continue
                pairs += 1
                assert (pa[key] < pb[key]) == (ma < mb), (a["case"], b["case"], key, pa[key], pb[key])
    assert pairs >= 30


def test_the_h100_walkthrough_single_stream_is_within_2x_and_explained() -> None:
    """The seed's reference (4 x 8 H100, SGLang TP32/EP32, InfiniBand disabled: NCCL over TCP sockets): ~5.8 tok/s
    for one stream and 14.0 at concurrency 4. Decode there is latency-bound by 186 all-reduces a token over sockets
    (the catalog's socket_hop_latency_us is fitted on the single stream, so concurrency 4 is the check), and the
    prediction's band, extrapolated on Hopper, holds both figures; the same cluster on InfiniBand predicts 10x
    faster, which is why a plain H100 topology predicts far above the walkthrough."""
    def run(env: dict[str, str], concurrency: int) -> Any:
        doc = topology_dict(gpu="h100-80gb", per_node=8, nodes=4, tp=32, ep=32, max_running_requests=4)
        doc["engine"]["env"] = env
        return predict_plan(plan_of(copy.deepcopy(doc)), load_catalog(), Workload(1000, 1000, concurrency))

    one, four = run({"NCCL_IB_DISABLE": "1"}, 1), run({"NCCL_IB_DISABLE": "1"}, 4)
    assert 5.8 / 2 <= one.output_throughput <= 5.8 * 2
    assert one.decode.bound == "collectives" and one.band is not None and one.band.kind == "extrapolated"
    assert one.band.low(four.output_throughput) <= 14.0 <= one.band.high(four.output_throughput)
    assert run({}, 1).output_throughput > 10 * one.output_throughput


@pytest.mark.parametrize(("gpu", "per_node", "nodes", "tp", "ep", "pad"), [
    ("gb200", 4, 4, 16, 1, 4 / 3),  # 3072 / 16 = 192 experts' rows a GPU, padded to 256 by the TRT-LLM MoE kernel
    ("gb200", 4, 4, 16, 16, 1.0),   # EP: whole experts, 3072 rows
    ("b300", 8, 1, 8, 1, 1.0),      # 384 divides by 128
    ("h100-80gb", 8, 4, 32, 32, 1.0),  # Hopper's family sets no alignment
])
def test_expert_slices_are_padded_to_the_families_moe_alignment(gpu: str, per_node: int, nodes: int, tp: int,
                                                                 ep: int, pad: float) -> None:
    plan = plan_of(topology_dict(gpu=gpu, per_node=per_node, nodes=nodes, tp=tp, ep=ep))
    assert expert_padding(perf_inputs(plan, load_catalog())) == pytest.approx(pad)
