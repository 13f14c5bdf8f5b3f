"""`plan --search --workload`: every shape that fits, ranked by its predicted throughput or latency, and why
the top one wins."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, cast

from k3deploy.catalog.specs import Catalog
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.shape import Shape
from k3deploy.errors import InputError
from k3deploy.planning.perf_band import family_performance
from k3deploy.planning.perf_model import PerfInputs, PerfUnknown
from k3deploy.planning.prediction import Prediction, predict
from k3deploy.planning.search import Candidate, candidates
from k3deploy.planning.speculation import acceptance
from k3deploy.planning.workload import Workload, with_images
from k3deploy.topology.settings import Serving

Objective = Literal["throughput", "latency"]
OBJECTIVES: tuple[Objective, ...] = ("throughput", "latency")


class RankedShape(NamedTuple):
    """A candidate shape with its prediction (None when it does not fit) and whether it meets --tpot-max."""

    candidate: Candidate
    prediction: Prediction | None
    meets_tpot: bool
    reason: str
    drafts: int = 0  # DSpark draft tokens per step (0: no speculative decoding)

    def model_dump(self) -> dict[str, Any]:
        """One `plan --search --workload --json` shape."""
        from k3deploy.planning.prediction import prediction_json

        s = self.candidate.shape
        return {"tp": s.tp, "ep": s.ep, "dp": s.dp, "pp": s.pp, "dcp": s.dcp, "attn_tp": s.attn_tp,
                "draft_tokens": self.drafts, "feasible": self.candidate.error is None,
                "meets_tpot_max": self.meets_tpot, "reason": self.reason,
                "prediction": prediction_json(self.prediction) if self.prediction else None}


def objective_of(text: str) -> Objective:
    """`--objective` checked: throughput or latency."""
    if text not in OBJECTIVES:
        raise InputError(f"--objective {text}: expected {' or '.join(OBJECTIVES)}")
    return cast(Objective, text)


def _key(objective: Objective, r: RankedShape) -> tuple[Any, ...]:
    p = r.prediction
    if p is None:
        return (2, 0.0, 0.0)
    if objective == "throughput":
        return (0 if r.meets_tpot else 1, -p.output_throughput_per_gpu, p.tpot_s)
    # Latency counts only when every request runs at once: a capped batch hides requests in the queue.
    return (0 if r.meets_tpot else 1, p.capped_by is not None, p.tpot_s, p.ttft_s)


def rank_shapes(catalog: Catalog, *, model_id: str, hardware_id: str, gpus: int, family: EngineFamily,
                engine_id: str, workload: Workload, objective: Objective, tpot_max_ms: float | None = None,
                gpus_per_node: int | None = None, speculation: bool = False) -> list[RankedShape]:
    """Shapes (DCP included) sized for the workload's concurrency, best first for `objective`; with
    `speculation`, each fitting shape also with every DSpark draft length the catalog has an acceptance for,
    as the engine's DSPARK recipe serves it (SGLang: with ReplaySSM verify when the catalog has its ring)."""
    objective_of(objective)
    perf = catalog.performance.get(engine_id)
    if perf is None:
        raise InputError(f"the catalog has no performance entry for engine '{engine_id}'",
                         hint="add one under `performance:` with --catalog DIR")
    model, hw = catalog.models.get(model_id), catalog.hardware.get(hardware_id)
    if model is not None:
        workload = with_images(workload, model)
    context = workload.input_tokens + workload.output_tokens
    serving = Serving(max_running_requests=workload.concurrency, context_length=max(context, 1))
    drafts = [0, *sorted(model.draft_acceptance_length)] if speculation and model is not None else [0]
    eng = catalog.engines.get(engine_id)
    draft_kv = (eng.draft_kv_bytes_per_token or 0) if eng is not None else 0
    ring = eng.replay_ring if eng is not None and family == "sglang" else None
    if hw is not None:
        fam_perf, band = family_performance(perf, hw, engine_id, catalog.planner)
    out: list[RankedShape] = []
    fits: set[Shape] = set()
    for n in drafts:
        # Each draft length sizes its own caches: the draft's weights, KV and extra state slots take room.
        for c in candidates(catalog, model_id=model_id, hardware_id=hardware_id, gpus=gpus, family=family,
                            gpus_per_node=gpus_per_node, engine_id=engine_id, serving=serving, dcp_options=True,
                            drafts=n, replay_ring_len=ring.ring_len if n and ring is not None else 0):
            if c.error is not None or model is None or hw is None:
                if n == 0 or c.shape in fits:  # a shape that fits only without the draft says so once more
                    out.append(RankedShape(c, None, False, c.error or "not sized", n))
                continue
            if n == 0:
                fits.add(c.shape)
            inp = PerfInputs(model=model, hw=hw, shape=c.shape, perf=fam_perf, family=family,
                             kv_dtype=model.cache.kv_cache_dtype, ssm_dtype=model.cache.ssm_state_dtype,
                             drafts=n, accepted=acceptance(model, n), draft_kv_bytes_per_token=draft_kv, band=band)
            try:
                p = predict(inp, workload, max_running=c.capacity.max_running_requests,
                            kv_tokens=c.capacity.kv_tokens)
            except PerfUnknown as exc:
                out.append(RankedShape(c, None, False, str(exc), n))
                continue
            meets = tpot_max_ms is None or p.tpot_s * 1000 <= tpot_max_ms
            reason = "" if meets else f"TPOT {p.tpot_s * 1000:,.1f} ms > --tpot-max {tpot_max_ms:g}"
            out.append(RankedShape(c, p, meets, reason, n))
    return sorted(out, key=lambda r: _key(objective, r))


def shape_name(r: RankedShape) -> str:
    """TP8/EP8/DCP8/DSPARK7: TP, then every other degree above 1, then the draft tokens per step."""
    return parallel_name(r.candidate.shape, r.drafts)


def parallel_name(s: Shape, drafts: int = 0) -> str:
    """TP8/EP8/DCP8 (with `drafts`: /DSPARK7): TP, then every other degree above 1, then the draft tokens."""
    rest = [f"{k}{v}" for k, v in (("EP", s.ep), ("DP", s.dp), ("PP", s.pp), ("DCP", s.dcp)) if v > 1]
    rest += [f"DSPARK{drafts}"] if drafts else []
    return "/".join([f"TP{s.tp}", *rest])


class _Figures(Protocol):
    """What a ranking compares of a prediction (one deployment's or a prefill/decode service's)."""

    @property
    def output_throughput_per_gpu(self) -> float: ...
    @property
    def tpot_s(self) -> float: ...


class _Ranked(Protocol):
    @property
    def prediction(self) -> _Figures | None: ...
    @property
    def meets_tpot(self) -> bool: ...


R = TypeVar("R", bound=_Ranked)


def figure(objective: Objective, p: _Figures) -> str:
    """The figure a ranking is by: `12.3 output tok/s per GPU` or `TPOT 45.67 ms`."""
    return (f"{p.output_throughput_per_gpu:,.1f} output tok/s per GPU" if objective == "throughput"
            else f"TPOT {p.tpot_s * 1000:,.2f} ms")


def contest(rows: Sequence[R], objective: Objective, noun: str, name: Callable[[R], str]) -> tuple[R, R] | str:
    """The first of the ranked `rows` that fit and meet the limits, and the first after it that predicts more than
    0.5% apart; or, where there is no such pair, the sentence that says why the first wins (`noun`: shape, layout)."""
    ranked = [r for r in rows if r.prediction is not None and r.meets_tpot]
    if not ranked:
        return f"no {noun} fits and meets the TPOT limit" if rows else f"no legal {noun}"
    top = ranked[0]
    p = top.prediction
    assert p is not None
    if len(ranked) == 1:
        return f"{name(top)} wins with {figure(objective, p)}: the only {noun} that fits and meets the limits"

    def figure_of(pr: _Figures) -> float:
        return pr.output_throughput_per_gpu if objective == "throughput" else pr.tpot_s

    runner = next((r for r in ranked[1:] if r.prediction is not None
                   and abs(figure_of(r.prediction) - figure_of(p)) > 0.005 * figure_of(p)), None)
    if runner is None:
        return f"{name(top)} wins with {figure(objective, p)}; every other {noun} that fits predicts the same"
    return top, runner


def why_top(rows: list[RankedShape], objective: Objective) -> str:
    """Why the first row wins over the runner-up: the figures, and the per-token term that differs most."""
    got = contest(rows, objective, "shape", shape_name)
    if isinstance(got, str):
        return got
    top, runner = got
    p, q = top.prediction, runner.prediction
    assert p is not None and q is not None
    other = (f"{q.output_throughput_per_gpu:,.1f}" if objective == "throughput" else f"{q.tpot_s * 1000:,.2f} ms")
    diffs = _term_diffs(p, q)
    name, mine, theirs = max(diffs, key=lambda d: abs(d[1] - d[2]))
    return (f"{shape_name(top)} wins with {figure(objective, p)} against {other} for {shape_name(runner)}: per "
            f"output token its {name} takes {mine * 1000:,.3f} GPU-ms against {theirs * 1000:,.3f}")


def _term_diffs(p: Prediction, q: Prediction) -> list[tuple[str, float, float]]:
    """Per-output-token seconds of each term, on one replica's GPUs (batch and GPU count normalised)."""
    def per_token(pr: Prediction) -> dict[str, float]:
        n = max(pr.workload.output_tokens, 1)
        scale = pr.gpus / max(pr.running, 1) / n  # GPU-seconds per output token across the replica
        out = {t.name: t.seconds * pr.shape_pp * (n - 1) * scale for t in pr.decode.terms}
        out["prefill"] = (pr.wave_s - (n - 1) * pr.decode_step_s) * scale
        return out

    mine, theirs = per_token(p), per_token(q)
    return [(k, mine[k], theirs.get(k, 0.0)) for k in mine]
