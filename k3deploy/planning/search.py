"""Shape search: every legal shape for a pool of accelerators, with its verdict."""
from __future__ import annotations

from typing import Any, NamedTuple

from k3deploy.catalog.specs import Catalog, ModelSpec
from k3deploy.diagnostics import fmt_gib
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.shape import Shape, make_shape
from k3deploy.errors import InputError
from k3deploy.planning import rules
from k3deploy.planning.arith import divisors
from k3deploy.planning.capacity import Capacity, memory_issues
from k3deploy.planning.memory import MemoryBudget, MemoryInputs, memory_budget
from k3deploy.planning.vision import VisionServing
from k3deploy.topology.settings import Serving


class ShapeRow(NamedTuple):
    """One candidate shape (JSON field names are a stable contract)."""

    tp: int
    ep: int
    dp: int
    pp: int
    dcp: int
    attn_tp: int
    feasible: bool
    reason: str
    weights_bytes: int
    headroom_bytes: int
    cache_bytes: int

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value (one `plan --search --json` shape)."""
        return self._asdict()


# Far past any cluster; every shape of a bigger number would take minutes to list.
MAX_SEARCH_GPUS = 65_536


def _candidates(family: EngineFamily, gpus: int, layers: int) -> list[tuple[int, int, int, int, bool]]:
    """(tp, ep, dp, pp, attention_dp) tuples whose world size is `gpus`."""
    out = []
    for pp in (d for d in divisors(gpus) if d <= layers):
        if family == "sglang":
            tp = gpus // pp
            for ep in sorted({1, tp}):
                out += [(tp, ep, dp, pp, dp > 1) for dp in divisors(tp)]
        else:
            for dp in divisors(gpus // pp):
                tp = gpus // pp // dp
                out += [(tp, ep, dp, pp, False) for ep in sorted({1, tp * dp})]
    return out


def default_pairing(catalog: Catalog, hardware_id: str, engine_id: str | None,
                    model_id: str | None) -> tuple[str, str]:
    """(engine, model) for a search that leaves either out: the accelerator's engine (vLLM-Ascend on Ascend NPUs,
    else SGLang) and the first catalog model that engine can serve on it."""
    hw = catalog.hardware.get(hardware_id)
    if hw is None:
        raise InputError(f"unknown accelerator '{hardware_id}'", hint=f"known: {', '.join(catalog.hardware)}")
    engine = engine_id or ("vllm-ascend" if hw.vendor == "huawei" else "sglang")
    if model_id is not None:
        return engine, model_id
    fits = [m.id for m in catalog.models.values()
            if not any(i.severity == "error" for i in rules.pairing_issues(engine, m, hw))]
    return engine, (fits[0] if fits else next(iter(catalog.models)))


def legal_shapes(model: ModelSpec, family: EngineFamily, *, gpus: int, nnodes: int, gpus_per_node: int,
                 dcp_options: bool = False) -> list[Shape]:
    """Every shape of `gpus` accelerators on `nnodes` nodes the engine's parallel rules allow for `model`; with
    `dcp_options`, each also with decode-context parallel over its attention TP."""
    out = []
    for tp, ep, dp, pp, adp in _candidates(family, gpus, model.architecture.num_hidden_layers):
        base = make_shape(family, tp=tp, ep=ep, dp=dp, pp=pp, dcp=1, attention_dp=adp, nnodes=nnodes,
                          gpus_per_node=gpus_per_node, num_experts=model.architecture.num_experts)
        for dcp in sorted({1, base.attn_tp} if dcp_options else {1}):
            shape = base._replace(dcp=dcp)
            if not any(i.severity == "error" for i in rules.parallel_rules(model.architecture, family, shape)):
                out.append(shape)
    return out


class Candidate(NamedTuple):
    """A legal shape with its budget, capacity and the first memory error (None: it fits)."""

    shape: Shape
    memory: MemoryBudget
    capacity: Capacity
    error: str | None


def candidates(catalog: Catalog, *, model_id: str, hardware_id: str, gpus: int, family: EngineFamily,
               gpus_per_node: int | None = None, engine_id: str | None = None, serving: Serving | None = None,
               dcp_options: bool = False, drafts: int = 0, replay_ring_len: int = 0) -> list[Candidate]:
    """Every legal shape for `gpus` accelerators with its memory budget under `serving` (default settings
    when None); with `dcp_options`, each shape also with decode-context parallel over its attention TP;
    `drafts` > 0 sizes the caches with the speculative draft's weights, KV and state slots (with
    `replay_ring_len` > 0: SGLang ReplaySSM rings instead of the verify states)."""
    if model_id not in catalog.models:
        raise InputError(f"unknown model '{model_id}'", hint=f"known: {', '.join(catalog.models)}")
    if hardware_id not in catalog.hardware:
        raise InputError(f"unknown accelerator '{hardware_id}'", hint=f"known: {', '.join(catalog.hardware)}")
    model, hw = catalog.models[model_id], catalog.hardware[hardware_id]
    refused = [i for i in rules.pairing_issues(engine_id or family, model, hw) if i.severity == "error"]
    if refused:  # the same pairing `plan FILE` refuses
        i = refused[0]
        raise InputError(f"{i.message} [{i.code}]", hint=i.hint or "see `k3deploy plan --search --help`")
    per_node = gpus_per_node or hw.typical_gpus_per_node
    if not 1 <= gpus <= MAX_SEARCH_GPUS:
        raise InputError(f"--gpus {gpus}: expected 1 to {MAX_SEARCH_GPUS:,}")
    if per_node < 1 or gpus % per_node and gpus > per_node:
        raise InputError(f"--gpus {gpus} is not a whole number of {per_node}-GPU nodes",
                         hint="pass --gpus-per-node, or a multiple of it")
    nnodes = max(1, gpus // per_node)
    per_node = min(per_node, gpus)
    eng = catalog.engines[engine_id or family]
    reserve = round((hw.runtime_reserve_gib if hw.runtime_reserve_gib is not None
                     else catalog.planner.runtime_reserve_gib) * (1 << 30))
    serving = serving or Serving()
    out = []
    for shape in legal_shapes(model, family, gpus=gpus, nnodes=nnodes, gpus_per_node=per_node,
                              dcp_options=dcp_options):
        inp = MemoryInputs(family=family, engine=eng, reserve_bytes=reserve,
                           mem_fraction=serving.mem_fraction or eng.default_mem_fraction,
                           kv_dtype=serving.kv_cache_dtype or model.cache.kv_cache_dtype,
                           ssm_dtype=serving.state_dtype or model.cache.ssm_state_dtype,
                           prefix_cache=serving.prefix_cache, prefix_cache_strategy=serving.prefix_cache_strategy,
                           max_running_requests=serving.max_running_requests, drafts=drafts,
                           replay_ring_len=replay_ring_len,
                           # a proposal sized for its workload: SGLang's pools split by the K3 calculator's
                           # ratio (`mamba_full_memory_ratio: calculator` in a topology), not the default 0.9
                           pool_calculator=True,
                           # the engine's default flags: the tower where its rules put it at this shape
                           vision=VisionServing(images_per_request=serving.images_per_request,
                                                max_running_requests=serving.max_running_requests or 1,
                                                context_length=serving.context_length))
        m = memory_budget(model, hw.usable_bytes, shape, inp)
        issues, cap = memory_issues(m, family, serving.context_length, serving.max_running_requests)
        errors = [i for i in issues if i.severity == "error"]
        out.append(Candidate(shape, m, cap, errors[0].message if errors else None))
    return out


def search_shapes(catalog: Catalog, *, model_id: str, hardware_id: str, gpus: int, family: EngineFamily,
                  gpus_per_node: int | None = None, engine_id: str | None = None) -> list[ShapeRow]:
    """Legal shapes for `gpus` accelerators: feasible first, most cache memory first."""
    rows = []
    for c in candidates(catalog, model_id=model_id, hardware_id=hardware_id, gpus=gpus, family=family,
                        gpus_per_node=gpus_per_node, engine_id=engine_id):
        m, shape = c.memory, c.shape
        cache = max(m.kv_pool_bytes, 0) + max(m.state_pool_bytes, 0)
        reason = c.error or (f"{fmt_gib(cache)} for the KV and state caches per GPU, "
                             f"{fmt_gib(m.headroom_bytes)} headroom")
        rows.append(ShapeRow(tp=shape.tp, ep=shape.ep, dp=shape.dp, pp=shape.pp, dcp=1, attn_tp=shape.attn_tp,
                             feasible=c.error is None, reason=reason, weights_bytes=m.weights_bytes,
                             headroom_bytes=m.headroom_bytes, cache_bytes=cache))
    return sorted(rows, key=lambda r: (not r.feasible, -r.cache_bytes, r.pp, -r.ep))
