"""Predicted time to first token and time per output token of a prefill/decode deployment, per role.

A request's first token comes from a prefill instance (its prefill, then the transfer of the request's MLA KV
and KDA state to a decode over the scale-out fabric); every later token from a decode instance, one a step of
its running batch, with no prefill stalling it (prefill runs elsewhere). The figures are those of the benchmark
run itself (`bench_serving --max-concurrency C`, the workload's prompts, 5 x C unless given): the first C
requests arrive together and queue at the prefill role; each later one is sent as an earlier one finishes; a
prefilled request waits for a decode slot when the decode's batch is at its cap. Which role bounds the output
rate follows from that run, not from a choice between caps: the decode's batch is the requests that have come
through the prefill role and not yet finished, so a faster decode step gives a higher rate at the same
concurrency. TPOT is the decode step at the run's mean running batch; TTFT the run's mean; the output rate the
run's tokens over its duration. Each role's instances share the concurrency evenly. Pure."""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, NamedTuple

from k3deploy.catalog.specs import Catalog
from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import PerfUnknown, Term
from k3deploy.planning.prediction import (
    Prediction,
    decode_token_s,
    predict_topology,
    prediction_json,
    timed_topology,
)
from k3deploy.planning.workload import Workload
from k3deploy.topology.schema import Topology


class RolePrediction(NamedTuple):
    """TTFT (prefill, queue and transfer) and TPOT (decode), each with the terms that make it up."""

    workload: Workload
    ttft_s: float | None  # None: the transfer cannot be timed (ttft_unknown says why)
    tpot_s: float
    ttft_terms: tuple[Term, ...]
    tpot_terms: tuple[Term, ...]
    prefill: Prediction  # one prefill instance's, at its share of the clients
    decode: Prediction  # one decode instance's, at the run's mean batch
    instances: dict[str, int]  # role -> instances
    full_rate_per_s: dict[str, float]  # role -> requests/s it serves flat out (prefill back to back, decode full)
    full_batch: int  # a decode instance's batch when it holds all it can (its slots, or its clients if fewer)
    output_throughput: float  # the service's output tokens/s (module docstring)
    gpus: int  # every GPU of every instance of both roles
    ttft_unknown: str = ""

    @property
    def output_throughput_per_gpu(self) -> float:
        """Output tokens/s per GPU of the whole service."""
        return self.output_throughput / max(self.gpus, 1)

    @property
    def band(self) -> Band | None:
        """The decode role's band (TPOT and the output rate come from it)."""
        return self.decode.band

    def busy(self) -> dict[str, float]:
        """Role -> the service's request rate over the rate that role serves flat out."""
        rate = self.output_throughput / self.workload.output_tokens
        return {r: rate / max(x, 1e-12) for r, x in self.full_rate_per_s.items()}

    def bound(self, which: str) -> str:
        """What bounds `ttft`, `tpot` or `output_throughput`, named with its role. TTFT and TPOT: their largest
        term; the output rate: the busier role (the prefill role prefilling back to back, or the decode role
        decoding every request it can hold)."""
        if which == "output_throughput":
            busy = self.busy()
            role = max(busy, key=lambda r: busy[r])
            how = ("prefilling back to back" if role == "prefill" else
                   f"decoding {self.full_batch} request{'s' if self.full_batch != 1 else ''} an instance")
            return f"the {role} role ({busy[role]:.0%} of its rate {how})"
        if which == "ttft" and self.ttft_s is None:
            return "not predicted: the transfer cannot be timed"
        terms = self.ttft_terms if which == "ttft" else self.tpot_terms
        top = max(terms, key=lambda t: t.seconds)
        if top.name == "decode role: decode step":
            return f"decode role: the decode step, bound by {self.decode.decode.bound}"
        if top.name == "prefill role: prefill":
            return f"prefill role: the prefill, bound by {self.prefill.prefill.bound}"
        if top.name == "queue":
            return "queue: for the prefill role and a decode slot"
        return top.name


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


class BenchRun(NamedTuple):
    """One benchmark run against a prefill role and a decode instance: its duration and per-request means."""

    duration_s: float
    ttft_s: float
    batch: float  # the decode's running batch as its tokens see it (a step of b requests counted b times)


def bench_run(clients: int, prompts: int, out: int, prefill_gap_s: float, first_token_s: float, cap: int,
              token_s: Callable[[int], float]) -> BenchRun:
    """`prompts` requests from `clients` closed-loop clients (all sent at once, each next one when one finishes):
    the prefill role starts one every `prefill_gap_s` in arrival order, its first token reaches the decode
    `first_token_s` after the start, and waits there for one of `cap` slots; the decode then emits a token per
    request every `token_s(batch)` until `out`. Event by event: the batch is constant between events."""
    ready: list[tuple[float, int]] = []  # (first token at the decode, request)
    running: list[tuple[int, int]] = []  # (the decode step it finishes on, request)
    sent_at: dict[int, float] = {}
    free = now = ttft = 0.0
    step = done = tokens = weighted = 0

    def send(i: int, at: float) -> None:
        nonlocal free
        start = max(at, free)
        free = start + prefill_gap_s
        sent_at[i] = at
        heapq.heappush(ready, (start + first_token_s, i))

    for i in range(min(clients, prompts)):
        send(i, 0.0)
    sent = len(sent_at)
    while done < prompts:
        while ready and ready[0][0] <= now and len(running) < cap:
            _, i = heapq.heappop(ready)
            ttft += now - sent_at[i]
            heapq.heappush(running, (step + out - 1, i))
        if not running:
            now = ready[0][0]
            continue
        batch, dt = len(running), token_s(len(running))
        steps = running[0][0] - step
        if ready and batch < cap:  # the next arrival joins at the first step boundary after it is ready
            steps = min(steps, max(1, math.ceil((ready[0][0] - now) / dt)))
        now += steps * dt
        step += steps
        tokens += batch * steps
        weighted += batch * batch * steps
        while running and running[0][0] <= step:
            heapq.heappop(running)
            done += 1
            if sent < prompts:
                send(sent, now)
                sent += 1
    return BenchRun(now, ttft / prompts, weighted / tokens if tokens else 1.0)


def predict_roles(t: Topology, catalog: Catalog, w: Workload) -> RolePrediction:
    """The workload's mean TTFT and TPOT across the roles of `t`, and the service's output rate, from its
    benchmark run (module docstring); PerfUnknown when a role cannot be timed, no TTFT when only the transfer
    cannot."""
    from k3deploy.topology.pd import instance_topology, instances, role_group

    assert t.roles is not None
    first = {i.role: i for i in reversed(instances(t))}
    groups = {r: role_group(t, r) for r in ("prefill", "decode")}
    share = {r: max(1, math.ceil(w.concurrency / groups[r].instances)) for r in ("prefill", "decode")}
    pre_t, dec_t = instance_topology(t, first["prefill"]), instance_topology(t, first["decode"])
    pre = predict_topology(pre_t, catalog, w._replace(output_tokens=2, concurrency=share["prefill"]))
    admitted, inp = timed_topology(dec_t, catalog, w._replace(concurrency=share["decode"]))
    gpus = sum(len(g.nodes) for g in groups.values()) * t.hardware.gpus_per_node
    unknown = ""
    try:
        transfer: Term | None = transfer_s(pre_t, catalog, w.input_tokens)
    except PerfUnknown as exc:  # the decode's figures stand without it
        transfer, unknown = None, str(exc)
    hand_off = pre.prefill_latency_s + (transfer.seconds if transfer else 0.0)
    context = w.input_tokens + w.output_tokens / 2
    steps: dict[int, float] = {}

    def token_s(batch: int) -> float:
        if batch not in steps:
            steps[batch] = decode_token_s(inp, batch, context)
        return steps[batch]

    # Each decode instance serves its share of the clients, fed by its share of the prefill role's rate.
    rate = groups["prefill"].instances * pre.prefills_per_s / groups["decode"].instances
    prompts = math.ceil(w.prompts / groups["decode"].instances)
    run = bench_run(share["decode"], prompts, w.output_tokens, 1 / rate, hand_off, admitted.running, token_s)
    dec = predict_topology(dec_t, catalog, w._replace(concurrency=max(1, round(run.batch))))
    tpot_terms = tuple(Term(f"decode role: {x.name}", x.seconds, x.how) for x in dec.tpot_terms
                       if x.name != "prefill stalls")
    tpot = sum(x.seconds for x in tpot_terms)
    ttft_terms = (Term("prefill role: prefill", pre.prefill_latency_s, pre.ttft_terms[0].how),
                  Term("queue", run.ttft_s - hand_off,
                       f"waiting for the prefill role ({rate:,.2f} prompts/s a decode instance) and for one of "
                       f"{admitted.running} decode slots, over a run of {prompts:,} prompts from {share['decode']} "
                       f"clients (mean decode batch {run.batch:,.0f})"))
    output = groups["decode"].instances * prompts * w.output_tokens / run.duration_s
    held = min(admitted.running, share["decode"])  # a decode instance's batch when it decodes all it can hold
    full = {"prefill": groups["prefill"].instances * pre.prefills_per_s,
            "decode": groups["decode"].instances * held / ((w.output_tokens - 1) * token_s(held))}
    return RolePrediction(w, run.ttft_s if transfer else None, tpot, (*ttft_terms, *((transfer,) if transfer else ())),
                          tpot_terms, pre, dec, {r: g.instances for r, g in groups.items()}, full, held, output, gpus,
                          ttft_unknown=unknown)


def roles_json(p: RolePrediction) -> dict[str, Any]:
    """The service's figures under `vllm bench serve` result names, what bounds each, the band, and each role's
    terms (milliseconds): `plan --json --workload` and validate's effort stage show this one document."""
    from k3deploy.planning.prediction import band_json, terms_json

    ttft_ms = p.ttft_s * 1000 if p.ttft_s is not None else None
    return {
        "mean_ttft_ms": ttft_ms, "mean_tpot_ms": p.tpot_s * 1000, "mean_itl_ms": p.tpot_s * 1000,
        "output_throughput": p.output_throughput, "output_throughput_per_gpu": p.output_throughput_per_gpu,
        "max_concurrency": p.workload.concurrency, "num_prompts": p.workload.prompts, "gpus": p.gpus,
        "workload": p.workload.model_dump(),
        "bounds": {"ttft": p.bound("ttft"), "tpot": p.bound("tpot"), "itl": p.bound("tpot"),
                   "output_throughput": p.bound("output_throughput")},
        "busy": p.busy(),
        "prefill": {"instances": p.instances["prefill"], "gpus_per_instance": p.prefill.gpus, "mean_ttft_ms": ttft_ms,
                    "terms": terms_json(p.ttft_terms), "prefill_terms": terms_json(p.prefill.prefill.terms),
                    **({"not_timed": p.ttft_unknown} if p.ttft_unknown else {})},
        "decode": {"instances": p.instances["decode"], "gpus_per_instance": p.decode.gpus,
                   "running_requests": p.decode.running, "mean_tpot_ms": p.tpot_s * 1000,
                   "terms": terms_json(p.tpot_terms), "decode_step_terms": terms_json(p.decode.decode.terms)},
        "band": band_json(p.band, p.tpot_s, p.output_throughput),
    }


def prediction_document(p: Prediction | RolePrediction) -> dict[str, Any]:
    """`plan --json --workload`'s `prediction`: one deployment's, or a prefill/decode service's per role."""
    return roles_json(p) if isinstance(p, RolePrediction) else prediction_json(p)
