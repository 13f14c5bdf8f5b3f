"""Planning one deployment without roles (a replica's shape, memory, capacity, router): legality, memory
and feasibility, every issue located in the file. Pure."""
from __future__ import annotations

import difflib

from k3deploy.catalog.specs import GIB, Catalog, EngineDefaults, HardwareSpec, ModelSpec, ReplayRing
from k3deploy.diagnostics import Issue
from k3deploy.engines import rules as engine_rules
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.kinds import engine_flavour
from k3deploy.engines.shape import Shape
from k3deploy.planning import rules
from k3deploy.planning.capacity import memory_issues
from k3deploy.planning.concurrency_fixes import concurrency_fixes
from k3deploy.planning.drafts import draft_issues, draft_tokens_budgeted
from k3deploy.planning.memory import MemoryInputs, memory_budget, weights_bytes_per_gpu
from k3deploy.planning.perf_band import family_performance
from k3deploy.planning.perf_model import PerfInputs, PerfUnknown, engine_speed, prefill_latency_s
from k3deploy.planning.plan_model import Plan, UnitFacts
from k3deploy.planning.pool import policy_issues, pool, router_plan
from k3deploy.planning.speculation import acceptance, draft_tokens, pinned_acceptance, replay_ring_len
from k3deploy.planning.vision import vision_plan, vision_serving
from k3deploy.topology.loader import LoadedTopology
from k3deploy.topology.schema import Topology
from k3deploy.topology.units import UnitInstance

# What each group of checks reads: a value left out by a schema error blocks the groups that read it.
READS = {
    "node": ("nodes", "launch.executor"),
    "legality": ("parallel", "hardware.gpus_per_node", "engine.kind", "engine.mimic"),
    "pairing": ("engine.kind", "model.revision"),
    "engine": ("engine", "parallel", "serving", "launch", "model.path"),
    "memory": ("parallel", "serving", "hardware", "engine.kind", "engine.mimic"),
    "budgets": ("validate", "serving.context_length"),
}
CHECKS = {"node": "node checks (ranks, addresses)", "legality": "parallel legality",
          "pairing": "model/engine/accelerator pairing", "engine": "engine flag checks", "memory": "memory budget",
          "budgets": "validate request budgets"}


def _unknown(code: str, what: str, value: str, options: list[str], path: str) -> Issue:
    prefixed = sorted(o for o in options if o.startswith(value.lower()))
    match = prefixed[:1] or difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    hint = f"did you mean '{match[0]}'?" if match else f"known: {', '.join(sorted(options))}"
    return Issue(code=code, severity="error", message=f"unknown {what} '{value}'", path=path, hint=hint)


def memory_inputs(t: Topology, catalog: Catalog, model: ModelSpec, hw: HardwareSpec,
                  family: EngineFamily) -> MemoryInputs:
    """Serving settings merged with catalog defaults."""
    return serving_inputs(t, catalog, model, hw, family, catalog.engines[engine_flavour(t.engine, hw.vendor)])


def serving_inputs(t: Topology, catalog: Catalog, model: ModelSpec, hw: HardwareSpec, family: EngineFamily,
                   eng: EngineDefaults) -> MemoryInputs:
    """memory_inputs for an engine whose catalog defaults (`eng`, by its flavour) are known."""
    s = t.serving
    drafts, draft = draft_tokens_budgeted(model, t.engine.args)
    reserve_gib = s.reserve_gib if s.reserve_gib is not None else (
        hw.runtime_reserve_gib if hw.runtime_reserve_gib is not None else catalog.planner.runtime_reserve_gib)
    return MemoryInputs(
        family=family, engine=eng, reserve_bytes=round(reserve_gib * GIB),
        mem_fraction=s.mem_fraction or eng.default_mem_fraction,
        kv_dtype=s.kv_cache_dtype or model.cache.kv_cache_dtype,
        ssm_dtype=s.state_dtype or model.cache.ssm_state_dtype,
        prefix_cache=s.prefix_cache, prefix_cache_strategy=s.prefix_cache_strategy,
        max_running_requests=s.max_running_requests, avg_request_tokens=s.avg_request_tokens,
        pool_ratio=s.mamba_full_memory_ratio if isinstance(s.mamba_full_memory_ratio, float) else None,
        pool_calculator=s.mamba_full_memory_ratio == "calculator", drafts=drafts, draft=draft,
        replay_ring_len=_replay_ring_len(t, eng.replay_ring), vision=vision_serving(t),
    )


def perf_inputs_for(t: Topology, catalog: Catalog, model: ModelSpec, hw: HardwareSpec, shape: Shape,
                    family: EngineFamily) -> PerfInputs:
    """The performance model's inputs for one replica of `t`; PerfUnknown when the catalog cannot time it."""
    return _perf_inputs(t, catalog, model, hw, shape, family, catalog.engines[engine_flavour(t.engine, hw.vendor)])


def _perf_inputs(t: Topology, catalog: Catalog, model: ModelSpec, hw: HardwareSpec, shape: Shape,
                 family: EngineFamily, eng: EngineDefaults) -> PerfInputs:
    perf = catalog.performance.get(t.engine.kind)
    if perf is None:
        raise PerfUnknown(f"the catalog has no performance entry for engine kind '{t.engine.kind}'")
    inp = serving_inputs(t, catalog, model, hw, family, eng)
    drafts = draft_tokens(t.engine.args)
    perf, band = family_performance(perf, hw, t.engine.kind, catalog.planner)
    vendor = catalog.vendors.get(hw.vendor)
    off = vendor.rdma_disable_env if vendor is not None else None
    return PerfInputs(model=model, hw=hw, shape=shape, perf=perf, family=family, kv_dtype=inp.kv_dtype,
                      ssm_dtype=inp.ssm_dtype, speed=engine_speed(perf.speed_env, t.engine.env), drafts=drafts,
                      accepted=pinned_acceptance(perf.acceptance_env, t.engine.env, drafts) or acceptance(model, drafts),
                      draft_kv_bytes_per_token=inp.engine.draft_kv_bytes_per_token or 0, band=band,
                      sockets=off is not None and t.engine.env.get(off, "0") not in ("", "0"))


def _replay_ring_len(t: Topology, ring: ReplayRing | None) -> int:
    """ReplaySSM ring records per state slot the engine flags ask for; 0 when off (a bad length is the engine
    flag checks' to report)."""
    try:
        return replay_ring_len(t.engine.args, ring)
    except PerfUnknown:
        return 0


def _blocked(group: str, unchecked: frozenset[str]) -> str | None:
    """The first left-out value the group reads (a path equal to, inside or around one it reads)."""
    for path in sorted(unchecked):
        if any(f"{path}.".startswith(f"{r}.") or f"{r}.".startswith(f"{path}.") for r in READS[group]):
            return path
    return None


def blocked_groups(unchecked: frozenset[str]) -> dict[str, str]:
    """Each group of checks a left-out value blocks -> that value's path."""
    return {g: b for g in READS if (b := _blocked(g, unchecked)) is not None}


def _not_checked(groups: list[str], why: str, path: str) -> Issue:
    return Issue(code="NOT_CHECKED", severity="info", path=path,
                 message=f"{', '.join(CHECKS[g] for g in groups)}: not checked {why}")


def plan_instance(loaded: LoadedTopology, catalog: Catalog, unchecked: frozenset[str], facts: UnitFacts,
                  inst: UnitInstance) -> Plan:
    """make_plan of a topology without roles (or of one role's instance `inst`, as `loaded`): check legality,
    size memory and decide feasibility from the unit's `facts`; never raises on a bad shape. Values in
    `unchecked` (dotted paths a schema error left out) block only the checks that read them."""
    whole = loaded.topology
    assert whole.roles is None, "a topology with roles is planned by planning.pd.pd_plan"
    t = inst.topology  # every replica has the same shape; its nodes decide the world size
    family = facts.family
    issues: list[Issue] = []
    model = catalog.models.get(t.model.id)
    hw = catalog.hardware.get(t.hardware.gpu)
    if model is None:
        issues.append(_unknown("UNKNOWN_MODEL", "model", t.model.id, list(catalog.models), "model.id"))
    if hw is None:
        issues.append(_unknown("UNKNOWN_HARDWARE", "accelerator", t.hardware.gpu, list(catalog.hardware), "hardware.gpu"))
    blocked = blocked_groups(unchecked)
    for path in sorted(set(blocked.values())):
        issues.append(_not_checked([g for g, b in blocked.items() if b == path], f"until {path} is fixed", path))
    memory = capacity = None
    shape = facts.shapes.get(inst.role)
    eng = catalog.engines[facts.flavour] if facts.flavour is not None else None
    if "node" not in blocked:
        issues += list(rules.node_rules(whole))
    issues += policy_issues(whole, facts.router_policies)
    if "budgets" not in blocked:
        issues += list(rules.budget_rules(t))
    if model is None:
        issues.append(_not_checked([g for g in ("legality", "pairing", "engine", "memory") if g not in blocked],
                                   "until model.id names a known model", "model.id"))
    elif shape is not None:
        legality = list(rules.parallel_rules(model.architecture, family, shape))
        issues += legality
        if hw is None or facts.flavour is None or eng is None:
            issues.append(_not_checked([g for g in ("pairing", "engine", "memory") if g not in blocked],
                                       "until hardware.gpu names a known accelerator", "hardware.gpu"))
        else:
            issues += [] if "pairing" in blocked else list(rules.pairing_rules(t, model, hw))
            issues += [] if "engine" in blocked else list(rules.seed_rules(t, model)) + draft_issues(
                t.engine.args, catalog, model, facts.flavour)
            issues += [] if "engine" in blocked else list(engine_rules.engine_rules(
                t, model, hw, shape, bf16_weights_bytes=sum(weights_bytes_per_gpu(model, shape, experts_bf16=True))))
            if any(i.code.startswith(("TP_", "DP_NOT", "DCP_")) for i in legality):
                issues.append(_not_checked(["memory"], "while the parallel shape is illegal", "parallel"))
            elif any(i.code == "VLLM_MAX_NUM_SEQS" for i in issues):
                issues.append(_not_checked(["memory"], "until serving.max_running_requests is set",
                                           "serving.max_running_requests"))
            elif "memory" not in blocked:
                inputs = serving_inputs(t, catalog, model, hw, family, eng)
                memory = memory_budget(model, hw.usable_bytes, shape, inputs)
                mem_issues, capacity = memory_issues(memory, family, t.serving.context_length,
                                                      t.serving.max_running_requests)
                issues += [i._replace(hint=concurrency_fixes(model, hw.usable_bytes, shape, inputs, memory,
                                                             t.serving.max_running_requests or 0))
                           if i.code == "CONCURRENCY_CAPPED" else i for i in mem_issues]
    replicated = whole.replicas > 1 or whole.router is not None
    the_pool = router = None
    if replicated and capacity is not None and shape is not None:
        the_pool = pool(whole.replicas, len(t.nodes) * t.hardware.gpus_per_node, capacity.kv_tokens,
                        capacity.max_running_requests)
    if whole.router is not None:
        router, router_issues = router_plan(whole, catalog.planner.router_health_margin,
                                            longest_prefill(t, catalog, model, hw, shape, family, eng),
                                            facts.layout.router_node, facts.worker_urls)
        issues += router_issues
    located = tuple(locate(i, loaded) for i in issues)
    vision = vision_plan(t, model, family, shape) if model is not None and shape is not None else None
    return Plan(file=loaded.file, topology=whole, model=model, hardware=hw, family=family, shape=shape,
                memory=memory, capacity=capacity, issues=located, pool=the_pool, router=router, vision=vision,
                instances=(inst,) if facts.layout.pd_family is not None else facts.layout.instances)


def longest_prefill(t: Topology, catalog: Catalog, model: ModelSpec | None, hw: HardwareSpec | None,
                    shape: Shape | None, family: EngineFamily, eng: EngineDefaults | None) -> float | str:
    """The predicted prefill of the longest prompt one replica allows (every attention group at once), or why
    it cannot be timed (`eng`: the engine's catalog defaults)."""
    if model is None or hw is None or shape is None or eng is None:
        return "the plan has no model, accelerator or shape to time"
    try:
        inp = _perf_inputs(t, catalog, model, hw, shape, family, eng)
        return prefill_latency_s(inp, t.serving.context_length, inp.attn_groups)
    except PerfUnknown as exc:
        return str(exc)


def locate(issue: Issue, loaded: LoadedTopology) -> Issue:
    """The issue with the line and column of its path in the topology file."""
    path: list[str | int] = []
    for part in issue.path.replace("]", "").replace("[", ".").split("."):
        if part:
            path.append(int(part) if part.isdigit() else part)
    pos = loaded.source.locate(tuple(path))
    return issue._replace(line=pos.line, column=pos.column)
