"""Predicted TTFT, TPOT, ITL and throughput of a workload on a planned deployment, each with its bounding term.

Requests of equal length at a fixed concurrency (as `vllm bench serve --max-concurrency C` sends them)
start together and so run in waves: the R running requests of a wave prefill one after another (per
attention group; pipelined across PP stages), then decode together, one token per request per step.

- TTFT = one prefill's latency + (R - 1) / 2 prefills of queue ahead, on average (+ a whole wave for
  requests beyond what the caches admit). Where a prefill stalls the running batch (SGLang, vLLM) the requests
  that prefilled first wait for the last, so the batch finishes together and every wave queues anew (the
  published B300 and MI350X TTFTs at 16 and 64 requests are the full queue's). Where the engine decodes beside a
  prefill (the stand-in), only the first wave (C of the P prompts) arrives together; the later requests are sent
  as earlier ones finish, a prefill apart, and find the prefill free unless the prefills outlast the decode
  (then a request waits out its slot's cycle: R prefills - (out - 1) x TPOT);
- TPOT = the decode step at batch R (PP: the stages in series; speculating, the verify step plus the draft's
  passes, over the tokens a verify keeps) + the prefills that stall the batch
  while it decodes, (R - 1) / 2 of them spread over (out - 1) tokens (engines whose prefill holds up
  decode: SGLang, vLLM); ITL's mean is TPOT's;
- output throughput = R x out / (the wave's prefills + (out - 1) decode steps), per GPU over the replica.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from k3deploy.catalog.specs import Catalog
from k3deploy.errors import InputError
from k3deploy.planning.calibration import Calibration
from k3deploy.planning.draft_cost import draft_cost, with_draft
from k3deploy.planning.instance_plan import memory_inputs, perf_inputs_for
from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import (
    PerfInputs,
    PerfUnknown,
    Step,
    Term,
    decode_step,
    p2p_s,
    prefill,
    prefill_latency_s,
    require_timeable,
)
from k3deploy.planning.plan_model import Plan
from k3deploy.planning.workload import Workload, with_images
from k3deploy.topology.schema import Topology


class Prediction(NamedTuple):
    """Mean figures of a workload run, under `vllm bench serve` result names, and their explanation."""

    workload: Workload
    running: int
    gpus: int
    ttft_s: float
    tpot_s: float
    e2el_s: float
    wave_s: float
    decode_step_s: float
    shape_pp: int
    output_throughput: float
    decode: Step
    prefill: Step
    ttft_terms: tuple[Term, ...]
    tpot_terms: tuple[Term, ...]
    capped_by: str | None
    band: Band | None = None  # how far the factors behind it are known to hold (planning/perf_band)
    calibration: Calibration | None = None  # the cluster's own factors it applies (planning/calibration)
    prefill_latency_s: float = 0.0  # one prompt's prefill through every stage, nothing queued ahead
    prefills_per_s: float = 0.0  # prompts the replica prefills a second when busy (attention groups, PP overlapped)

    @property
    def output_throughput_per_gpu(self) -> float:
        """Output tokens/s per GPU of the replica."""
        return self.output_throughput / max(self.gpus, 1)

    def bound(self, which: str, short: bool = False) -> str:
        """The term that contributes most to `ttft` or `tpot` (the decode step named by its own bound)."""
        terms = self.ttft_terms if which == "ttft" else self.tpot_terms
        top = max(terms, key=lambda t: t.seconds)
        if top.name == "decode step":
            return self.decode.bound if short else f"the decode step, bound by {self.decode.bound}"
        if top.name == "prefill":
            return self.prefill.bound if short else f"the prefill, bound by {self.prefill.bound}"
        return top.name

    def bench_fields(self) -> dict[str, Any]:
        """The prediction under the field names of `vllm bench serve --save-result` files."""
        w = self.workload
        return {
            "max_concurrency": w.concurrency, "num_prompts": w.prompts,
            "total_input_tokens": w.input_tokens * w.prompts, "total_output_tokens": w.output_tokens * w.prompts,
            "duration": w.prompts * w.output_tokens / self.output_throughput,
            "request_throughput": self.output_throughput / w.output_tokens,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.output_throughput * (w.input_tokens + w.output_tokens) / w.output_tokens,
            "mean_ttft_ms": self.ttft_s * 1000, "mean_tpot_ms": self.tpot_s * 1000,
            "mean_itl_ms": self.tpot_s * 1000, "mean_e2el_ms": self.e2el_s * 1000,
            "output_throughput_per_gpu": self.output_throughput_per_gpu,
        }


def perf_inputs(plan: Plan, catalog: Catalog) -> PerfInputs:
    """The model's inputs for a planned topology; PerfUnknown when the catalog cannot time it."""
    t, model, hw, shape = plan.topology, plan.model, plan.hardware, plan.shape
    if model is None or hw is None or shape is None:
        raise PerfUnknown("the plan has no model, accelerator or shape to time")
    return perf_inputs_for(t, catalog, model, hw, shape, plan.family)


def predict(inp: PerfInputs, w: Workload, *, max_running: int | None = None, kv_tokens: int | None = None
            ) -> Prediction:
    """The workload's mean TTFT, TPOT and throughput on one replica laid out as `inp` says."""
    require_timeable(inp.model)
    s = inp.shape
    need = w.input_tokens + w.output_tokens
    caps = {"concurrency": w.concurrency}
    if max_running is not None:
        caps["the KDA state pool / max_running_requests"] = max(max_running, 1)
    if kv_tokens is not None:
        caps[f"the KV pool ({kv_tokens:,} tokens / {need:,} per request)"] = max(kv_tokens // need, 1)
    capped_by = min(caps, key=lambda k: caps[k])
    running = caps[capped_by]
    groups = inp.attn_groups
    queue = math.ceil(running / groups)  # requests per attention group, prefilled one after another
    pre = prefill(inp, w.input_tokens, min(groups, running))
    a, b = inp.decode_scale, inp.prefill_scale  # a cluster's own factors (planning/calibration), else 1
    hop_pre = p2p_s(inp, w.input_tokens) * b
    prefill_gap = pre.seconds * b + hop_pre  # a stage is busy this long per prompt; PP overlaps prompts
    prefill_latency = prefill_latency_s(inp, w.input_tokens, min(groups, running)) * b
    micro = min(running, s.pp)
    context = w.input_tokens + w.output_tokens / 2
    batch = math.ceil(running / micro)
    hop = p2p_s(inp, math.ceil(running / micro))

    def decoding(n: int) -> tuple[Step, float]:
        return _decoding(inp, n, hop, context)

    step, step_s = decoding(batch)
    # A slot's turn: its prefill and decode, or its turn at the prefills where those are the bound.
    cycle = max(prefill_latency + (w.output_tokens - 1) * step_s, queue * prefill_gap)
    if not inp.perf.prefill_stalls_decode and batch > 1:
        # Decoding beside a prefill, the slots drift apart (below): a request decodes beside each other slot for
        # the share of that slot's cycle it decodes, so it sees 1 + (R - 1) x decode / cycle requests on average.
        seen = 1 + (batch - 1) * min((w.output_tokens - 1) * step_s / cycle, 1.0)
        low, high = decoding(math.floor(seen)), decoding(math.ceil(seen))
        step, step_s = (high if seen - math.floor(seen) >= 0.5 else low)[0], low[1] + (high[1] - low[1]) * (
            seen - math.floor(seen))
        cycle = max(prefill_latency + (w.output_tokens - 1) * step_s, queue * prefill_gap)
    wave = prefill_latency + (queue - 1) * prefill_gap + (w.output_tokens - 1) * step_s
    waves = max(w.prompts / running, 1.0)
    # The whole run. Where a prefill stalls the batch, every wave runs as the first. Decoding beside a prefill, a
    # slot's later requests follow each other a cycle apart.
    duration = waves * wave if inp.perf.prefill_stalls_decode else wave + (waves - 1) * cycle
    waiting = max(w.concurrency - running, 0) / w.concurrency * wave
    stall = (queue - 1) / 2 * prefill_gap / (w.output_tokens - 1) if inp.perf.prefill_stalls_decode else 0.0
    tpot = step_s + stall
    # The share of requests that arrive together and queue: all of them where a prefill stalls the batch (every
    # wave resynchronises), else the first wave's; the later ones wait only where the prefills are the bound.
    first = 1.0 if inp.perf.prefill_stalls_decode else min(w.concurrency, w.prompts) / w.prompts
    later = max(queue * prefill_gap - (w.output_tokens - 1) * tpot - prefill_latency, 0.0)
    queued = first * (queue - 1) / 2 * prefill_gap + (1 - first) * later
    ttft = prefill_latency + queued + waiting
    ttft_terms = (
        Term("prefill", prefill_latency, f"{w.input_tokens:,} tokens"
             + (f" through {s.pp} stages" if s.pp > 1 else "") + f": {pre.seconds * b * 1000:,.1f} ms per stage"),
        Term("queue", queued, f"{(queue - 1) / 2:g} prefills ahead on average ({queue} per attention group)"
             if first == 1 else f"the first {min(w.concurrency, w.prompts):,} of {w.prompts:,} requests wait "
             f"{(queue - 1) / 2:g} prefills on average ({queue} per attention group), later ones "
             + (f"{later * 1000:,.1f} ms (the prefills outlast the decode)" if later else
                "none (they arrive staggered as earlier ones finish)")),
        Term("waiting for a slot", waiting, f"requests beyond {running} wait a wave ({wave:,.1f} s)"),
    )
    spec = (f", verifying {inp.drafts + 1} tokens per request and keeping {inp.accepted:g}" if inp.drafts else "")
    tpot_terms = (
        Term("decode step", s.pp * step.seconds / inp.accepted * a, f"batch {running}"
             + (f" in {micro} micro-batches through {s.pp} stages" if s.pp > 1 else "") + spec),
        Term("pipeline hand-offs", (s.pp - 1) * hop / inp.accepted * a, f"{s.pp - 1} stage boundaries"),
        Term("prefill stalls", stall, f"{(queue - 1) / 2:g} prefills of {prefill_gap * 1000:,.0f} ms over "
             f"{w.output_tokens - 1:,} tokens" if inp.perf.prefill_stalls_decode else
             "this engine decodes beside a prefill"),
    )
    return Prediction(workload=w, running=running, gpus=s.world_size, ttft_s=ttft, tpot_s=tpot,
                      e2el_s=ttft + (w.output_tokens - 1) * tpot, wave_s=wave, decode_step_s=step_s, shape_pp=s.pp,
                      output_throughput=running * w.output_tokens * waves / duration, decode=step, prefill=pre,
                      ttft_terms=ttft_terms, tpot_terms=tpot_terms,
                      capped_by=None if capped_by == "concurrency" else capped_by, band=inp.band,
                      prefill_latency_s=prefill_latency, prefills_per_s=groups / prefill_gap)


def _decoding(inp: PerfInputs, n: int, hop: float, context: float) -> tuple[Step, float]:
    """The decode step at batch n (per micro-batch) and its seconds per kept token: the PP stages in series with
    `hop` between them, over the tokens a verify keeps, at the cluster's own decode factor."""
    st = with_draft(decode_step(inp, n, context), draft_cost(inp, math.ceil(n / inp.attn_groups), context))
    return st, (inp.shape.pp * st.seconds + (inp.shape.pp - 1) * hop) / inp.accepted * inp.decode_scale


def decode_token_s(inp: PerfInputs, running: int, context: float) -> float:
    """Seconds per kept token of every one of `running` requests decoding together (PP: in micro-batches)."""
    batch = math.ceil(running / min(running, inp.shape.pp))
    return _decoding(inp, batch, p2p_s(inp, batch), context)[1]


def calibrated(inp: PerfInputs, calibration: Calibration | None) -> PerfInputs:
    """`inp` with a cluster's own factors applied (unchanged without them)."""
    return calibration.apply(inp) if calibration is not None else inp


def predict_plan(plan: Plan, catalog: Catalog, w: Workload, calibration: Calibration | None = None) -> Prediction:
    """`predict` for a planned topology, capped by its caches (a plan that sized none predicts uncapped), with
    the cluster's own factors when it has them; a workload's images cost the tokens the model's processor gives
    them."""
    cap = plan.capacity
    limit = plan.topology.serving.images_per_request
    if w.images and limit is not None and w.images > limit:
        raise InputError(f"{plan.file}: --workload images={w.images}: serving.images_per_request is {limit}, so the "
                         "engine refuses such requests", hint="send fewer images, or raise serving.images_per_request")
    if plan.model is not None:
        w = with_images(w, plan.model)
    p = predict(calibrated(perf_inputs(plan, catalog), calibration), w,
                max_running=cap.max_running_requests if cap else None, kv_tokens=cap.kv_tokens if cap else None)
    return p._replace(calibration=calibration)


def predict_topology(t: Topology, catalog: Catalog, w: Workload, calibration: Calibration | None = None
                     ) -> Prediction:
    """`predict` for a loaded topology without its file positions (validate's effort stage, calibrate): the
    shape and the caches' capacity as `plan` sizes them, with the cluster's own factors when given; PerfUnknown
    when the shape is not legal or cannot be timed."""
    return timed_topology(t, catalog, w, calibration)[0]


def timed_topology(t: Topology, catalog: Catalog, w: Workload, calibration: Calibration | None = None
                   ) -> tuple[Prediction, PerfInputs]:
    """`predict_topology`, and the model's inputs it timed the topology with."""
    from k3deploy.engines.kinds import engine_family
    from k3deploy.engines.shape import make_shape
    from k3deploy.planning import rules
    from k3deploy.planning.capacity import memory_issues
    from k3deploy.planning.memory import memory_budget

    model, hw = catalog.models.get(t.model.id), catalog.hardware.get(t.hardware.gpu)
    if model is None or hw is None:
        raise PerfUnknown(f"the catalog knows no model '{t.model.id}' or accelerator '{t.hardware.gpu}'")
    family = engine_family(t.engine.kind, getattr(t.engine, "mimic", None))
    p = t.parallel
    shape = make_shape(family, tp=p.tp, ep=p.ep, dp=p.dp, pp=p.pp, dcp=p.dcp, attention_dp=p.attention_dp,
                       nnodes=len(t.nodes), gpus_per_node=t.hardware.gpus_per_node,
                       num_experts=model.architecture.num_experts)
    if any(i.severity == "error" for i in rules.parallel_rules(model.architecture, family, shape)):
        raise PerfUnknown("the topology's parallel shape is not legal (`k3deploy plan` says why)")
    inp = memory_inputs(t, catalog, model, hw, family)
    budget = memory_budget(model, hw.usable_bytes, shape, inp)
    _issues, cap = memory_issues(budget, family, t.serving.context_length, t.serving.max_running_requests)
    pin = calibrated(perf_inputs_for(t, catalog, model, hw, shape, family), calibration)
    got = predict(pin, w, max_running=cap.max_running_requests or None, kv_tokens=cap.kv_tokens or None)
    return got._replace(calibration=calibration), pin


def prediction_json(p: Prediction) -> dict[str, Any]:
    """`vllm bench serve` result fields, plus the terms behind them (milliseconds) and each figure's bound."""
    return {
        **p.bench_fields(),
        "workload": p.workload.model_dump(), "running_requests": p.running, "capped_by": p.capped_by,
        "gpus": p.gpus,
        "bounds": {"ttft": p.bound("ttft"), "tpot": p.bound("tpot"), "itl": p.bound("tpot"),
                   "output_throughput": p.bound("tpot")},
        "ttft_terms": terms_json(p.ttft_terms), "tpot_terms": terms_json(p.tpot_terms),
        "decode_step_terms": terms_json(p.decode.terms), "prefill_terms": terms_json(p.prefill.terms),
        "band": band_json(p.band, p.tpot_s, p.output_throughput),
        # Only a calibrated prediction carries the key: an uncalibrated document is as it always was.
        **({"calibration": p.calibration.as_json()} if p.calibration is not None else {}),
    }


def terms_json(ts: tuple[Term, ...]) -> list[dict[str, Any]]:
    """Each term's name, milliseconds and how."""
    return [{"name": t.name, "ms": t.seconds * 1000, "how": t.how} for t in ts]


def band_json(band: Band | None, tpot_s: float, output_throughput: float) -> dict[str, Any] | None:
    """The band's kind, width and why, and the TPOT (ms) and output tok/s ranges it spans."""
    if band is None:
        return None
    return {**band.model_dump(), "mean_tpot_ms": [band.low(tpot_s) * 1000, band.high(tpot_s) * 1000],
            "output_throughput": [band.low(output_throughput), band.high(output_throughput)]}
