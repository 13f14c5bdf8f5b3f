"""make_plan: a validated topology in, a frozen Plan (legality, memory, capacity) out. Pure."""
from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any, NamedTuple

from k3deploy.catalog.specs import GIB, Catalog, HardwareSpec, ModelSpec
from k3deploy.diagnostics import Issue, fmt_gib
from k3deploy.engines import rules as engine_rules
from k3deploy.engines.context import Inputs
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.kinds import engine_family, engine_flavour
from k3deploy.engines.shape import Shape, make_shape
from k3deploy.errors import InfeasibleError
from k3deploy.planning import rules
from k3deploy.planning.memory import MemoryBudget, MemoryInputs, memory_budget, weights_bytes_per_gpu
from k3deploy.planning.perf_model import PerfInputs, PerfUnknown, engine_speed, prefill_latency_s
from k3deploy.planning.pool import Pool, RouterPlan, policy_issues, pool, router_plan
from k3deploy.planning.speculation import acceptance, draft_tokens
from k3deploy.topology.loader import LoadedTopology
from k3deploy.topology.replicas import replica_topology
from k3deploy.topology.schema import Topology

if TYPE_CHECKING:
    from k3deploy.planning.pd import PdPlan

# Mistakes in the file itself, whatever the hardware can do (exit 2, like a schema error); every other
# error is a shape or budget that cannot run (exit 1).
INPUT_CODES = frozenset({"UNKNOWN_MODEL", "UNKNOWN_HARDWARE", "RANKS_PARTIAL", "RANKS_DUPLICATE", "RANKS_GAP",
                         "IP_UNSPECIFIED", "IP_LOOPBACK", "DUPLICATE_IP", "DUPLICATE_HOST",
                         "ROUTER_POLICY", "PD_ROUTER_KIND", "PD_OWNED_FLAG", "PD_SIDE_CHANNEL_ENV",
                         "PD_DECODE_LAYOUT_FLAG"})
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


class Capacity(NamedTuple):
    """What the caches hold."""

    kv_tokens: int
    max_running_requests: int
    max_context_tokens: int

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value (the `plan --json` capacity object)."""
        return self._asdict()


class Plan(NamedTuple):
    """Everything later stages need: the topology, catalog entries, shape, budget and verdict."""

    file: str
    topology: Topology
    model: ModelSpec | None
    hardware: HardwareSpec | None
    family: EngineFamily
    shape: Shape | None
    memory: MemoryBudget | None
    capacity: Capacity | None
    issues: tuple[Issue, ...]
    pool: Pool | None = None  # with replicas or a router: what all replicas hold together
    router: RouterPlan | None = None
    pd: PdPlan | None = None  # with roles: each role's plan (the fields above are decode's)

    @property
    def valid(self) -> bool:
        """No mistake in the file itself (exit 2): ids the catalog knows, a usable node list."""
        return self.model is not None and self.hardware is not None and not any(
            i.code in INPUT_CODES and i.severity == "error" for i in self.issues)

    @property
    def feasible(self) -> bool:
        """No error-severity issue."""
        return self.valid and not any(i.severity == "error" for i in self.issues)

    def render_inputs(self, python: str = "python3", replica: int = 0) -> Inputs:
        """What the renderers take from a feasible plan (for one replica: its nodes and ports);
        InfeasibleError naming the codes otherwise. `python` runs the stand-in engine (kind sim without
        engine.launcher)."""
        if not self.feasible or self.model is None or self.hardware is None or self.shape is None \
                or self.memory is None:
            codes = ", ".join(i.code for i in self.issues if i.severity == "error") or "incomplete plan"
            raise InfeasibleError(f"{self.file}: cannot render an infeasible plan ({codes})",
                                  hint=f"run `k3deploy plan {self.file}`")
        if self.pd is not None:  # each instance has its own shape and nodes: planning.pd.instance_inputs
            raise ValueError("a plan with roles renders per instance (planning.pd.instance_inputs)")
        return Inputs(topology=replica_topology(self.topology, replica), model=self.model, hardware=self.hardware, shape=self.shape,
                      mem_fraction=self.memory.mem_fraction, pool_ratio=self.memory.pool_ratio, python=python)

    def digest(self) -> str:
        """A stable hash of the topology (what a deployment record pins)."""
        import hashlib  # only launch needs it; OpenSSL's start-up cost stays off the `plan` path

        doc = self.topology.model_dump(mode="json", by_alias=True)
        # Sections added later enter the hash only when used, so a record made before them still matches.
        for key, unset in (("replicas", 1), ("replica_nodes", None), ("router", None), ("roles", None)):
            if doc.get(key) == unset:
                doc.pop(key)
        slurm = doc.get("launch", {}).get("slurm")
        if isinstance(slurm, dict) and not any(v is not None for v in slurm.values()):
            doc["launch"].pop("slurm")
        blob = json.dumps(doc, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _unknown(code: str, what: str, value: str, options: list[str], path: str) -> Issue:
    prefixed = sorted(o for o in options if o.startswith(value.lower()))
    match = prefixed[:1] or difflib.get_close_matches(value, options, n=1, cutoff=0.5)
    hint = f"did you mean '{match[0]}'?" if match else f"known: {', '.join(sorted(options))}"
    return Issue(code=code, severity="error", message=f"unknown {what} '{value}'", path=path, hint=hint)


def memory_inputs(t: Topology, catalog: Catalog, model: ModelSpec, hw: HardwareSpec,
                  family: EngineFamily) -> MemoryInputs:
    """Serving settings merged with catalog defaults."""
    eng = catalog.engines[engine_flavour(t.engine, hw.vendor)]
    s = t.serving
    reserve_gib = s.reserve_gib if s.reserve_gib is not None else (
        hw.runtime_reserve_gib if hw.runtime_reserve_gib is not None else catalog.planner.runtime_reserve_gib)
    return MemoryInputs(
        family=family, engine=eng, reserve_bytes=round(reserve_gib * GIB),
        mem_fraction=s.mem_fraction or eng.default_mem_fraction,
        kv_dtype=s.kv_cache_dtype or model.cache.kv_cache_dtype,
        ssm_dtype=s.state_dtype or model.cache.ssm_state_dtype,
        prefix_cache=s.prefix_cache, prefix_cache_strategy=s.prefix_cache_strategy,
        max_running_requests=s.max_running_requests, avg_request_tokens=s.avg_request_tokens,
        pool_ratio=s.mamba_full_memory_ratio, drafts=_drafts(t),
    )


def perf_inputs_for(t: Topology, catalog: Catalog, model: ModelSpec, hw: HardwareSpec, shape: Shape,
                    family: EngineFamily) -> PerfInputs:
    """The performance model's inputs for one replica of `t`; PerfUnknown when the catalog cannot time it."""
    perf = catalog.performance.get(t.engine.kind)
    if perf is None:
        raise PerfUnknown(f"the catalog has no performance entry for engine kind '{t.engine.kind}'")
    inp = memory_inputs(t, catalog, model, hw, family)
    drafts = draft_tokens(t.engine.args)
    return PerfInputs(model=model, hw=hw, shape=shape, perf=perf, family=family, kv_dtype=inp.kv_dtype,
                      ssm_dtype=inp.ssm_dtype, speed=engine_speed(perf.speed_env, t.engine.env), drafts=drafts,
                      accepted=acceptance(model, drafts),
                      draft_kv_bytes_per_token=inp.engine.draft_kv_bytes_per_token or 0)


def _drafts(t: Topology) -> int:
    """Draft tokens per step the engine flags ask for; 0 when the flags name no draft the model times (the
    performance model then says why)."""
    from k3deploy.planning.perf_model import PerfUnknown
    from k3deploy.planning.speculation import draft_tokens

    try:
        return draft_tokens(t.engine.args)
    except PerfUnknown:
        return 0


def memory_issues(m: MemoryBudget, family: EngineFamily, context_length: int,
                  max_running_requests: int) -> tuple[list[Issue], Capacity]:
    """Feasibility verdicts on a budget, each saying by how much."""
    out: list[Issue] = []
    need = m.weights_bytes + m.reserve_bytes
    ctx = context_length
    if need > m.usable_bytes:
        out.append(Issue(code="MEM_WEIGHTS", severity="error", path="parallel",
                         message=f"weights {fmt_gib(m.weights_bytes)} + reserve {fmt_gib(m.reserve_bytes)} = "
                         f"{fmt_gib(need)} exceed usable {fmt_gib(m.usable_bytes)} per GPU by "
                         f"{fmt_gib(need - m.usable_bytes)}",
                         hint="shard wider (more GPUs, higher tp/ep) or use a larger accelerator; "
                         "`k3deploy plan --search` lists shapes that fit"))
    elif m.kv_pool_bytes <= 0 or (m.state_pool_bytes <= 0 and m.kda_state_bytes_per_slot > 0):
        out.append(Issue(code="MEM_NO_CACHE", severity="error", path="serving.mem_fraction",
                         message=f"mem_fraction {m.mem_fraction} x usable {fmt_gib(m.usable_bytes)} leaves no cache "
                         f"memory after weights {fmt_gib(m.weights_bytes)}"
                         + (f" and reserve {fmt_gib(m.reserve_bytes)}" if family == "vllm" else ""),
                         hint="raise serving.mem_fraction or shard wider"))
    else:
        if m.kv_tokens < ctx:
            short = (ctx - m.kv_tokens) * m.mla_kv_bytes_per_token
            out.append(Issue(code="MEM_KV_CONTEXT", severity="error", path="serving.context_length",
                             message=f"the KV pool holds {m.kv_tokens} tokens; one request at context_length "
                             f"{ctx} needs {ctx} (short by {ctx - m.kv_tokens} tokens = {fmt_gib(short)})"))
        if m.state_requests < 1:
            out.append(Issue(code="MEM_STATE", severity="error", path="serving",
                             message=f"the KDA state pool ({fmt_gib(m.state_pool_bytes)}) cannot hold one request's "
                             f"{m.slots_per_request} slots x {m.kda_state_bytes_per_slot} B"))
    if family == "sglang" and m.headroom_bytes < 0 and need <= m.usable_bytes:
        out.append(Issue(code="MEM_RUNTIME", severity="warning", path="serving.mem_fraction",
                         message=f"mem_fraction {m.mem_fraction} leaves {fmt_gib(m.usable_bytes * (1 - m.mem_fraction))}"
                         f" outside the static pools, below the {fmt_gib(m.reserve_bytes)} runtime reserve: "
                         "CUDA-graph capture may run out of memory",
                         hint=f"lower mem_fraction to {1 - m.reserve_bytes / m.usable_bytes:.3f} or less"))
    running = min(max_running_requests, m.state_requests)
    if m.state_requests and m.state_requests < max_running_requests:
        out.append(Issue(code="CONCURRENCY_CAPPED", severity="warning", path="serving.max_running_requests",
                         message=f"the KDA state pool holds {m.state_requests} requests, fewer than "
                         f"max_running_requests {max_running_requests}"))
    per_request = m.kv_tokens // max(max_running_requests, 1)
    cap = Capacity(kv_tokens=m.kv_tokens, max_running_requests=running, max_context_tokens=min(per_request, ctx))
    if m.kv_tokens >= ctx and per_request < ctx:
        out.append(Issue(code="CONTEXT_AT_CONCURRENCY", severity="warning", path="serving.context_length",
                         message=f"the KV pool holds {m.kv_tokens:,} tokens: at {max_running_requests} concurrent "
                         f"requests each can get {per_request:,} tokens, not context_length {ctx:,}",
                         hint=f"full-length requests fit {m.kv_tokens // ctx} at a time: lower "
                         f"max_running_requests to {m.kv_tokens // ctx}, or context_length to {per_request:,}, "
                         "or shard wider"))
    return out, cap


def _blocked(group: str, unchecked: frozenset[str]) -> str | None:
    """The first left-out value the group reads (a path equal to, inside or around one it reads)."""
    for path in sorted(unchecked):
        if any(f"{path}.".startswith(f"{r}.") or f"{r}.".startswith(f"{path}.") for r in READS[group]):
            return path
    return None


def _not_checked(groups: list[str], why: str, path: str) -> Issue:
    return Issue(code="NOT_CHECKED", severity="info", path=path,
                 message=f"{', '.join(CHECKS[g] for g in groups)}: not checked {why}")


def make_plan(loaded: LoadedTopology, catalog: Catalog, unchecked: frozenset[str] = frozenset()) -> Plan:
    """Check legality, size memory and decide feasibility; never raises on a bad shape. Values in
    `unchecked` (dotted paths a schema error left out) block only the checks that read them."""
    whole = loaded.topology
    if whole.roles is not None:
        from k3deploy.planning.pd import pd_plan  # it plans each role's instance with this function

        return pd_plan(loaded, catalog, unchecked)
    t = replica_topology(whole, 0)  # every replica has the same shape; its nodes decide the world size
    family = engine_family(t.engine.kind, getattr(t.engine, "mimic", None))
    issues: list[Issue] = []
    model = catalog.models.get(t.model.id)
    hw = catalog.hardware.get(t.hardware.gpu)
    if model is None:
        issues.append(_unknown("UNKNOWN_MODEL", "model", t.model.id, list(catalog.models), "model.id"))
    if hw is None:
        issues.append(_unknown("UNKNOWN_HARDWARE", "accelerator", t.hardware.gpu, list(catalog.hardware), "hardware.gpu"))
    blocked = {g: b for g in READS if (b := _blocked(g, unchecked)) is not None}
    for path in sorted(set(blocked.values())):
        issues.append(_not_checked([g for g, b in blocked.items() if b == path], f"until {path} is fixed", path))
    shape = memory = capacity = None
    if "node" not in blocked:
        issues += list(rules.node_rules(whole))
    issues += policy_issues(whole)
    if "budgets" not in blocked:
        issues += list(rules.budget_rules(t))
    if model is None:
        issues.append(_not_checked([g for g in ("legality", "pairing", "engine", "memory") if g not in blocked],
                                   "until model.id names a known model", "model.id"))
    elif "legality" not in blocked:
        p = t.parallel
        shape = make_shape(family, tp=p.tp, ep=p.ep, dp=p.dp, pp=p.pp, dcp=p.dcp, attention_dp=p.attention_dp,
                           nnodes=len(t.nodes), gpus_per_node=t.hardware.gpus_per_node,
                           num_experts=model.architecture.num_experts)
        legality = list(rules.parallel_rules(model.architecture, family, shape))
        issues += legality
        if hw is None:
            issues.append(_not_checked([g for g in ("pairing", "engine", "memory") if g not in blocked],
                                       "until hardware.gpu names a known accelerator", "hardware.gpu"))
        else:
            issues += [] if "pairing" in blocked else list(rules.pairing_rules(t, model, hw))
            issues += [] if "engine" in blocked else list(engine_rules.engine_rules(
                t, model, hw, shape, bf16_weights_bytes=sum(weights_bytes_per_gpu(model, shape, experts_bf16=True))))
            if any(i.code.startswith(("TP_", "DP_NOT", "DCP_")) for i in legality):
                issues.append(_not_checked(["memory"], "while the parallel shape is illegal", "parallel"))
            elif "memory" not in blocked:
                memory = memory_budget(model, hw.usable_bytes, shape, memory_inputs(t, catalog, model, hw, family))
                mem_issues, capacity = memory_issues(memory, family, t.serving.context_length,
                                                      t.serving.max_running_requests)
                issues += mem_issues
    replicated = whole.replicas > 1 or whole.router is not None
    the_pool = router = None
    if replicated and capacity is not None and shape is not None:
        the_pool = pool(whole.replicas, len(t.nodes) * t.hardware.gpus_per_node, capacity.kv_tokens,
                        capacity.max_running_requests)
    if whole.router is not None:
        router, router_issues = router_plan(whole, catalog.planner.router_health_margin,
                                            longest_prefill(t, catalog, model, hw, shape, family))
        issues += router_issues
    located = tuple(_locate(i, loaded) for i in issues)
    return Plan(file=loaded.file, topology=whole, model=model, hardware=hw, family=family, shape=shape,
                memory=memory, capacity=capacity, issues=located, pool=the_pool, router=router)


def longest_prefill(t: Topology, catalog: Catalog, model: ModelSpec | None, hw: HardwareSpec | None,
                     shape: Shape | None, family: EngineFamily) -> float | str:
    """The predicted prefill of the longest prompt one replica allows (every attention group at once), or why
    it cannot be timed."""
    if model is None or hw is None or shape is None:
        return "the plan has no model, accelerator or shape to time"
    try:
        inp = perf_inputs_for(t, catalog, model, hw, shape, family)
        return prefill_latency_s(inp, t.serving.context_length, inp.attn_groups)
    except PerfUnknown as exc:
        return str(exc)


def _locate(issue: Issue, loaded: LoadedTopology) -> Issue:
    path: list[str | int] = []
    for part in issue.path.replace("]", "").replace("[", ".").split("."):
        if part:
            path.append(int(part) if part.isdigit() else part)
    pos = loaded.source.locate(tuple(path))
    return issue._replace(line=pos.line, column=pos.column)
