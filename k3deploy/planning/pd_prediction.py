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

import math
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from k3deploy.catalog.specs import Catalog
from k3deploy.planning.calibration import Calibration
from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import PerfUnknown, Term
from k3deploy.planning.plan_model import Plan
from k3deploy.planning.prediction import (
    Prediction,
    decode_token_s,
    predict_plan,
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
    # Both queues stay in order: the prefill starts prompts in arrival order, and a request admitted later
    # finishes on a later step; so they are plain FIFOs.
    ready: deque[float] = deque()  # when each prefilled request's first token is at the decode, in arrival order
    sent_at: deque[float] = deque()  # when each of those was sent
    running: deque[int] = deque()  # the decode step each running request finishes on
    free = now = ttft = 0.0
    step = done = tokens = weighted = 0
    sent = min(clients, prompts)
    for _ in range(sent):
        ready.append(free + first_token_s)
        sent_at.append(0.0)
        free += prefill_gap_s
    while done < prompts:
        while ready and ready[0] <= now and len(running) < cap:
            ready.popleft()
            ttft += now - sent_at.popleft()
            running.append(step + out - 1)
        if not running:
            now = ready[0]
            continue
        batch = len(running)
        dt = token_s(batch)
        steps = running[0] - step
        if ready and batch < cap:  # the next arrival joins at the first step boundary after it is ready
            steps = min(steps, max(1, math.ceil((ready[0] - now) / dt)))
        now += steps * dt
        step += steps
        tokens += batch * steps
        weighted += batch * batch * steps
        while running and running[0] <= step:
            running.popleft()
            done += 1
            if sent < prompts:  # the client sends its next prompt; the prefill starts it when free
                start = max(now, free)
                free = start + prefill_gap_s
                ready.append(start + first_token_s)
                sent_at.append(now)
                sent += 1
    return BenchRun(now, ttft / prompts, weighted / tokens if tokens else 1.0)


class PrefillRole(NamedTuple):
    """One prefill instance's part of a service: its prediction at its share of the clients and the hand-off of a
    request to a decode (its transfer: None, with why, where it cannot be timed)."""

    prediction: Prediction
    instances: int
    transfer: Term | None
    transfer_unknown: str


def prefill_role(t: Topology, catalog: Catalog, w: Workload, instances: int) -> PrefillRole:
    """The prefill part of `instances` instances laid out as `t` (one instance's topology) under workload `w`."""
    share = max(1, math.ceil(w.concurrency / instances))
    pre = predict_topology(t, catalog, w._replace(output_tokens=2, concurrency=share))
    try:
        return PrefillRole(pre, instances, transfer_s(t, catalog, w.input_tokens), "")
    except PerfUnknown as exc:  # the decode's figures stand without it
        return PrefillRole(pre, instances, None, str(exc))


class DecodeRole:
    """One decode instance's part of a service: the batch its caches admit, and its decode step and prediction at
    each batch a run asks for, each worked out once (a search pairs one decode layout with many prefill ones)."""

    def __init__(self, t: Topology, catalog: Catalog, w: Workload, instances: int) -> None:
        self.topology, self.catalog, self.workload, self.instances = t, catalog, w, instances
        self.clients = max(1, math.ceil(w.concurrency / instances))
        self.admitted, self.inputs = timed_topology(t, catalog, w._replace(concurrency=self.clients))
        self.context = w.input_tokens + w.output_tokens / 2
        self.prompts = math.ceil(w.prompts / instances)
        self._steps: dict[int, float] = {}
        self._at: dict[int, Prediction] = {}
        self._runs: dict[tuple[float, float], BenchRun] = {}

    def token_s(self, batch: int) -> float:
        """Seconds per output token of every request of a decode batch."""
        if batch not in self._steps:
            self._steps[batch] = decode_token_s(self.inputs, batch, self.context)
        return self._steps[batch]

    def run(self, prefill_gap_s: float, first_token_s: float) -> BenchRun:
        """The instance's benchmark run fed one prompt every `prefill_gap_s`, each first token `first_token_s`
        after its prefill starts (prefill layouts of equal figures share one run)."""
        key = (prefill_gap_s, first_token_s)
        if key not in self._runs:
            self._runs[key] = bench_run(self.clients, self.prompts, self.workload.output_tokens, prefill_gap_s,
                                        first_token_s, self.admitted.running, self.token_s)
        return self._runs[key]

    def at_batch(self, batch: int) -> Prediction:
        """The instance's prediction with `batch` requests running (TPOT's terms at a run's mean batch)."""
        if batch not in self._at:
            self._at[batch] = predict_topology(self.topology, self.catalog,
                                               self.workload._replace(concurrency=batch))
        return self._at[batch]


def predict_roles(t: Topology, catalog: Catalog, w: Workload) -> RolePrediction:
    """The workload's mean TTFT and TPOT across the roles of `t`, and the service's output rate, from its
    benchmark run (module docstring); PerfUnknown when a role cannot be timed, no TTFT when only the transfer
    cannot."""
    from k3deploy.topology.pd import instance_topology, instances, role_group

    assert t.roles is not None
    first = {i.role: i for i in reversed(instances(t))}
    groups = {r: role_group(t, r) for r in ("prefill", "decode")}
    gpus = sum(len(g.nodes) for g in groups.values()) * t.hardware.gpus_per_node
    pre = prefill_role(instance_topology(t, first["prefill"]), catalog, w, groups["prefill"].instances)
    return service(pre, DecodeRole(instance_topology(t, first["decode"]), catalog, w, groups["decode"].instances),
                   gpus)


def service(p: PrefillRole, d: DecodeRole, gpus: int) -> RolePrediction:
    """A prefill role and a decode role on `gpus` GPUs in all, as one service: its benchmark run (module
    docstring) and the figures of it."""
    w, pre, admitted = d.workload, p.prediction, d.admitted
    hand_off = pre.prefill_latency_s + (p.transfer.seconds if p.transfer else 0.0)
    # Each decode instance serves its share of the clients, fed by its share of the prefill role's rate.
    rate = p.instances * pre.prefills_per_s / d.instances
    prompts = d.prompts
    run = d.run(1 / rate, hand_off)
    dec = d.at_batch(max(1, round(run.batch)))
    tpot_terms = tuple(Term(f"decode role: {x.name}", x.seconds, x.how) for x in dec.tpot_terms
                       if x.name != "prefill stalls")
    tpot = sum(x.seconds for x in tpot_terms)
    ttft_terms = (Term("prefill role: prefill", pre.prefill_latency_s, pre.ttft_terms[0].how),
                  Term("queue", run.ttft_s - hand_off,
                       f"waiting for the prefill role ({rate:,.2f} prompts/s a decode instance) and for one of "
                       f"{admitted.running} decode slots, over a run of {prompts:,} prompts from {d.clients} "
                       f"clients (mean decode batch {run.batch:,.0f})"))
    output = d.instances * prompts * w.output_tokens / run.duration_s
    held = min(admitted.running, d.clients)  # a decode instance's batch when it decodes all it can hold
    full = {"prefill": p.instances * pre.prefills_per_s,
            "decode": d.instances * held / ((w.output_tokens - 1) * d.token_s(held))}
    transfer = (p.transfer,) if p.transfer else ()
    return RolePrediction(w, run.ttft_s if p.transfer else None, tpot, (*ttft_terms, *transfer), tpot_terms, pre,
                          dec, {"prefill": p.instances, "decode": d.instances}, full, held, output, gpus,
                          ttft_unknown=p.transfer_unknown)


def predict_unit(plan: Plan, catalog: Catalog, w: Workload, calibration: Calibration | None = None
                 ) -> Prediction | RolePrediction:
    """A planned unit's prediction: per role where it has prefill/decode roles (`calibrate` fits one instance,
    never such a service, so no calibration applies there), else `predict_plan` with the cluster's own factors."""
    if plan.topology.roles is not None:
        return predict_roles(plan.topology, catalog, w)
    return predict_plan(plan, catalog, w, calibration)


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
