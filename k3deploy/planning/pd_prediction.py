"""Predicted time to first token and time per output token of a prefill/decode deployment, per role.

A request's first token comes from a prefill instance: TTFT = that instance's prefill latency and queue (its
requests answer one token each, so nothing decodes there) + the transfer of the request's MLA KV and its KDA
state to the decode over the scale-out fabric. Every later token comes from a decode instance: TPOT = its
decode step at its batch, with no prefill stalling it (prefill runs elsewhere). Each role's instances share
the concurrency evenly. The service's output rate: the closed loop's (concurrency x answer / request time), no
more than the decode instances emit at their running batch (one token per request per TPOT) nor than the
prefill instances admit (their prompts per second x answer length). Pure."""
from __future__ import annotations

import math
from typing import NamedTuple

from k3deploy.catalog.specs import Catalog
from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import PerfUnknown, Term
from k3deploy.planning.prediction import Prediction, predict_topology
from k3deploy.planning.workload import Workload
from k3deploy.topology.schema import Topology


class RolePrediction(NamedTuple):
    """TTFT (prefill + transfer) and TPOT (decode), each with the terms that make it up."""

    ttft_s: float | None  # None: the transfer cannot be timed (ttft_unknown says why)
    tpot_s: float
    ttft_terms: tuple[Term, ...]
    tpot_terms: tuple[Term, ...]
    prefill: Prediction
    decode: Prediction
    ttft_unknown: str = ""
    output_throughput: float = 0.0  # the service's output tokens/s (module docstring)
    gpus: int = 0  # every GPU of every instance of both roles

    @property
    def output_throughput_per_gpu(self) -> float:
        """Output tokens/s per GPU of the whole service."""
        return self.output_throughput / max(self.gpus, 1)

    @property
    def band(self) -> Band | None:
        """The decode role's band (TPOT and the output rate come from it)."""
        return self.decode.band


def transfer_s(t: Topology, catalog: Catalog, input_tokens: int) -> Term:
    """One request's MLA KV and KDA state, prefill to decode, over the scale-out link (each rank pair at once)."""
    from k3deploy.engines.kinds import engine_family
    from k3deploy.planning.instance_plan import memory_inputs
    from k3deploy.planning.memory import kda_state_bytes_per_slot, mla_kv_bytes_per_token

    model, hw = catalog.models[t.model.id], catalog.hardware[t.hardware.gpu]
    if hw.scaleout_gbps is None or hw.scaleout_latency_us is None:
        raise PerfUnknown(f"hardware {hw.id} has no scaleout_gbps and scaleout_latency_us in the catalog: the "
                          "prefill-to-decode transfer cannot be timed")
    mem = memory_inputs(t, catalog, model, hw, engine_family(t.engine.kind, getattr(t.engine, "mimic", None)))
    arch, p = model.architecture, t.parallel
    attn_tp = p.tp // p.dp if p.attention_dp and p.tp % p.dp == 0 else p.tp
    nbytes = (input_tokens * mla_kv_bytes_per_token(arch, mem.kv_dtype)
              + kda_state_bytes_per_slot(arch, attn_tp, mem.ssm_dtype))
    seconds = hw.scaleout_latency_us * 1e-6 + nbytes / (hw.scaleout_gbps * 1e9)
    return Term("transfer", seconds, f"{nbytes / 2**20:,.1f} MiB of MLA KV and KDA state per GPU over scale-out")


def predict_roles(t: Topology, catalog: Catalog, w: Workload) -> RolePrediction:
    """The workload's mean TTFT and TPOT across the roles of `t` (PerfUnknown when a role cannot be timed; no
    TTFT when only the transfer cannot)."""
    from k3deploy.topology.pd import instance_topology, instances, role_group

    assert t.roles is not None
    first = {i.role: i for i in reversed(instances(t))}
    share = {r: max(1, math.ceil(w.concurrency / role_group(t, r).instances)) for r in ("prefill", "decode")}
    pre_t = instance_topology(t, first["prefill"])
    pre = predict_topology(pre_t, catalog, w._replace(output_tokens=2, concurrency=share["prefill"]))
    dec = predict_topology(instance_topology(t, first["decode"]), catalog, w._replace(concurrency=share["decode"]))
    ttft_terms = tuple(Term(f"prefill role: {x.name}", x.seconds, x.how) for x in pre.ttft_terms if x.seconds)
    tpot_terms = tuple(Term(f"decode role: {x.name}", x.seconds, x.how) for x in dec.tpot_terms
                       if x.name != "prefill stalls")
    tpot = sum(x.seconds for x in tpot_terms)
    groups = {r: role_group(t, r) for r in ("prefill", "decode")}
    gpus = sum(len(g.nodes) for g in groups.values()) * t.hardware.gpus_per_node
    decode_cap = groups["decode"].instances * dec.running / tpot
    prefill_cap = groups["prefill"].instances * pre.output_throughput / 2 * w.output_tokens  # 2: its answers

    def rate(ttft: float) -> float:
        loop = w.concurrency * w.output_tokens / (ttft + (w.output_tokens - 1) * tpot)
        return min(loop, decode_cap, prefill_cap)

    try:
        ttft_terms += (transfer_s(pre_t, catalog, w.input_tokens),)
    except PerfUnknown as exc:  # the decode's figure stands without it
        return RolePrediction(None, tpot, ttft_terms, tpot_terms, pre, dec, ttft_unknown=str(exc),
                              output_throughput=rate(pre.ttft_s), gpus=gpus)
    ttft = sum(x.seconds for x in ttft_terms)
    return RolePrediction(ttft, tpot, ttft_terms, tpot_terms, pre, dec, output_throughput=rate(ttft), gpus=gpus)
