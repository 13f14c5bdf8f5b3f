"""TTFT and TPOT per role of a prefill/decode deployment (planning/pd_prediction.py): the prefill instance's
prefill and queue plus the transfer of the MLA KV and KDA state; the decode instance's step with no prefill
stalling it; each role's instances sharing the concurrency; the figures those of the benchmark run."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.memory import kda_state_bytes_per_slot, mla_kv_bytes_per_token
from k3deploy.planning.pd_prediction import bench_run, predict_roles
from k3deploy.planning.prediction import predict_topology
from k3deploy.planning.workload import Workload
from k3deploy.topology.loader import parse_topology
from k3deploy.topology.pd import instance_topology, instances

pytestmark = pytest.mark.timeout(60)
SGLANG = Path(__file__).resolve().parents[2] / "topologies" / "pd-h200-1p1d-sglang.yaml"
W = Workload(input_tokens=8000, output_tokens=500, concurrency=8)


def _topology(**decode: Any) -> Any:
    doc: dict[str, Any] = yaml.safe_load(SGLANG.read_text(encoding="utf-8"))
    doc["roles"]["decode"].update(decode)
    return parse_topology(yaml.safe_dump(copy.deepcopy(doc), sort_keys=False), "p.yaml").topology


def test_ttft_is_the_prefill_role_plus_the_transfer_and_tpot_the_decode_role_alone() -> None:
    t, catalog = _topology(), load_catalog()
    pre_t, dec_t = (instance_topology(t, i) for i in instances(t))
    alone = predict_topology(pre_t, catalog, W._replace(output_tokens=2, concurrency=1))
    model, hw = catalog.models[t.model.id], catalog.hardware[t.hardware.gpu]
    arch = model.architecture
    nbytes = (W.input_tokens * mla_kv_bytes_per_token(arch, model.cache.kv_cache_dtype)
              + kda_state_bytes_per_slot(arch, pre_t.parallel.tp, model.cache.ssm_state_dtype))
    transfer = hw.scaleout_latency_us * 1e-6 + nbytes / (hw.scaleout_gbps * 1e9)
    one = predict_roles(t, catalog, W._replace(concurrency=1))  # one client: nothing ahead of it, a free slot
    assert [x.name for x in one.ttft_terms] == ["prefill role: prefill", "queue", "transfer"]
    assert one.ttft_terms[-1].seconds == pytest.approx(transfer)
    assert one.ttft_s == pytest.approx(alone.ttft_s + transfer) and one.ttft_terms[1].seconds == pytest.approx(0)
    p = predict_roles(t, catalog, W)  # eight at once queue at the prefill
    assert p.ttft_s == pytest.approx(sum(x.seconds for x in p.ttft_terms)) and p.ttft_s > one.ttft_s
    # The decode instance alone would be stalled by its own prefills; in PD it never prefills.
    dec = predict_topology(dec_t, catalog, W._replace(concurrency=p.decode.workload.concurrency))
    assert p.tpot_s == pytest.approx(dec.decode_step_s) and p.tpot_s < dec.tpot_s
    assert all("prefill" not in x.name for x in p.tpot_terms)


def test_two_decode_instances_share_the_concurrency() -> None:
    two = _topology(instances=2, parallel={"tp": 8, "ep": 8})
    p = predict_roles(two, load_catalog(), W)
    assert p.prefill.workload.concurrency == 8 and p.decode.workload.concurrency <= 4
    assert "from 4 clients" in p.ttft_terms[1].how
    assert p.prefill.workload.output_tokens == 2  # a prefill instance answers one token, then hands off


def test_the_benchmark_run_queues_at_the_prefill_and_waits_for_a_decode_slot() -> None:
    """Two clients, one prompt each, a prefill every 1 s whose first token reaches the decode 0.5 s after it starts,
    a 1 s decode step, 3 tokens a request: the second prompt waits out the first's prefill (TTFT 1.5 s), joins the
    first's decode (a step of two) and ends at 3.5 s. With one decode slot it waits for the first to finish."""
    free = bench_run(2, 2, 3, 1.0, 0.5, 10, lambda batch: 1.0)
    assert free == pytest.approx((3.5, (0.5 + 1.5) / 2, (1 + 2 * 2 + 1) / 4))
    one_slot = bench_run(2, 2, 3, 1.0, 0.5, 1, lambda batch: 1.0)
    assert one_slot == pytest.approx((4.5, (0.5 + 2.5) / 2, 1.0))


def test_without_scale_out_figures_only_the_decode_role_is_predicted() -> None:
    doc: dict[str, Any] = yaml.safe_load(SGLANG.read_text(encoding="utf-8"))
    doc["hardware"] = {"gpu": "sim", "gpus_per_node": 1}
    for role in ("prefill", "decode"):
        doc["roles"][role].update(nodes=doc["roles"][role]["nodes"][:1], parallel={"tp": 1, "ep": 1})
    doc["nodes"] = [n for n in doc["nodes"] if n["host"] in ("prefill-0", "decode-0")]
    doc["model"]["id"] = "kimi-k3-tiny"
    t = parse_topology(yaml.safe_dump(doc, sort_keys=False), "p.yaml").topology
    p = predict_roles(t, load_catalog(), W._replace(input_tokens=1000, output_tokens=200))
    assert p.ttft_s is None and "hardware sim has no scaleout_gbps" in p.ttft_unknown
    assert p.tpot_s > 0 and all(x.name != "transfer" for x in p.ttft_terms)
