"""Planning prefill/decode roles: each role's instance planned as a deployment of its own (prefill: weights,
activations, its short-lived cache; decode: MLA KV and the KDA state pool for the concurrency), the pool
summary, the router in PD mode, and the cross-role rules the engines enforce. Pure."""
from __future__ import annotations

import dataclasses
import re

from k3deploy.catalog.specs import Catalog
from k3deploy.diagnostics import Issue
from k3deploy.engines.context import Inputs
from k3deploy.engines.router import PD_FLAG
from k3deploy.planning.instance_plan import locate, longest_prefill, plan_instance
from k3deploy.planning.plan_model import PdPlan, Plan, RolePlan, UnitFacts
from k3deploy.planning.pool import policy_issues, router_plan
from k3deploy.topology.loader import LoadedTopology
from k3deploy.topology.pd import BACKENDS, ROLE_NAMES, Instance
from k3deploy.topology.schema import Topology
from k3deploy.topology.settings import Parallel
from k3deploy.topology.units import UnitInstance

# Flags k3deploy sets per instance from `roles`: one engine.args value for every instance would desync them
# (a bootstrap port other than the router's `--prefill URL BOOTSTRAP_PORT`: smg 1.13 registers both workers, yet
# no request passes, as the decode cannot reach the prefill's bootstrap server; seen on the rig).
OWNED = ("--disaggregation-mode", "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port",
         "--disaggregation-ib-device", "--kv-transfer-config")
# Older SGLang took decode's layout on the prefill (--disaggregation-decode-tp/-dp); SGLang 0.5.23's parser
# (engines/data/sglang-0.5.23.json) has neither: each side learns the other's at run time. Decode asks the
# prefill's bootstrap server (GET /route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&
# target_pp_rank=-1, disaggregation/common/conn.py:1302) for its attn TP/CP, DP, PP (PrefillServerInfo,
# :120) and maps its ranks onto them (_resolve_rank_mapping, :1432); prefill learns each decode's attn TP
# when that decode registers (dst_attn_tp_size, mooncake/conn.py:190).
DECODE_LAYOUT_FLAGS = ("--disaggregation-decode-tp", "--disaggregation-decode-dp")
# SGLang 0.5.23 flags that tie both roles to one attention TP (checked when a decode bootstraps).
SAME_ATTN_TP_FLAGS = {
    "--enable-kv-cache-sharding": "MLA KV cache sharding requires equal prefill/decode attn TP sizes "
                                  "(disaggregation/common/conn.py:1444)",
    "--enable-unified-memory": "--enable-unified-memory does not support different prefill / decode attention "
                               "TP sizes: the whole-envelope state cannot be TP-resliced "
                               "(disaggregation/mooncake/conn.py:1301)"}
SIDE_CHANNEL_ENV = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")


def _err(code: str, message: str, path: str, hint: str, severity: str = "error") -> Issue:
    return Issue(code=code, severity=severity, message=message, path=path, hint=hint)  # type: ignore[arg-type]


def cross_role_issues(t: Topology, hybrid: bool, family: str, router_pd: bool) -> list[Issue]:
    """What the engines refuse across roles, each with its reason and fix (`family`: whose disaggregation the
    engine follows; `router_pd`: whether the router has a PD mode)."""
    assert t.roles is not None
    out: list[Issue] = []
    pre, dec = t.roles.prefill.parallel, t.roles.decode.parallel
    if family == "vllm" and hybrid and pre.tp != dec.tp:
        out.append(_err("PD_NIXL_TP", f"prefill TP {pre.tp} != decode TP {dec.tp}: vLLM's NIXL handshake fails "
                        "for a hybrid (KDA + MLA) model unless both roles have the same TP (vllm#50765)",
                        "roles.decode.parallel.tp", f"give both roles tp {pre.tp} (vary dp or the instance count)"))
    for flag in t.engine.args:
        if flag in OWNED:
            out.append(_err("PD_OWNED_FLAG", f"{flag} is set per instance from `roles`: one value for every "
                            "instance breaks the pairing (a bootstrap port other than the one the router is given "
                            "after --prefill: the router registers both roles, yet every request fails, as the "
                            "decode cannot reach the prefill's bootstrap server)", f"engine.args.{flag}",
                            "remove it; set roles.transfer (backend, bootstrap_port, ib_devices)"))
        if family == "sglang" and flag in DECODE_LAYOUT_FLAGS:
            out.append(_err("PD_DECODE_LAYOUT_FLAG", f"{flag}: older SGLang took decode's TP/DP on the prefill; "
                            "SGLang 0.5.23 has no such flag: decode fetches prefill's layout from its bootstrap "
                            "server (GET /route, disaggregation/common/conn.py:1302) and registers its own "
                            "attn TP with prefill", f"engine.args.{flag}",
                            "remove it; each role's layout is roles.<role>.parallel"))
    for name in t.engine.env:
        if name in SIDE_CHANNEL_ENV:
            out.append(_err("PD_SIDE_CHANNEL_ENV", f"{name} in engine.env is one value for every node: NIXL "
                            "needs each node's own (an unset or shared host gives an engine-ID mismatch, "
                            "vllm#27083)", f"engine.env.{name}",
                            "remove it: k3deploy sets it per node (its ip; the port from roles.transfer)"))
    if family == "sglang":
        out += _sglang_layout_issues(t, hybrid)
    if pre.pp > 1:
        out.append(_err("PD_PREFILL_PP", f"prefill pp {pre.pp}: a pipelined prefill showed a ~30 s "
                        "time-to-first-token floor (sglang#34815)", "roles.prefill.parallel.pp",
                        "prefer tp/ep for prefill", severity="warning"))
    r = t.router
    if r is not None and not router_pd:
        out.append(_err("PD_ROUTER_KIND", f"{r.kind} has no PD mode ({PD_FLAG[r.kind]})", "router.kind",
                        "use a router with prefill/decode support"))
    return out


def _attn_tp(p: Parallel) -> int:
    """SGLang's attention TP of one instance (DP attention lives inside TP)."""
    return p.tp // p.dp if p.attention_dp and p.tp % p.dp == 0 else p.tp


def _sglang_layout_issues(t: Topology, hybrid: bool) -> list[Issue]:
    """The prefill/decode layouts SGLang 0.5.23's decode refuses (or maps wrongly) when it bootstraps."""
    assert t.roles is not None
    pre, dec = t.roles.prefill.parallel, t.roles.decode.parallel
    p_tp, d_tp = _attn_tp(pre), _attn_tp(dec)
    out: list[Issue] = []
    if dec.pp not in (1, pre.pp):
        out.append(_err("PD_SGLANG_PP", f"decode pp {dec.pp}, prefill pp {pre.pp}: SGLang's decode asserts "
                        "\"Decode pp size should be equal to prefill pp size or 1\" "
                        "(disaggregation/common/conn.py:1516)", "roles.decode.parallel.pp",
                        f"give decode pp {pre.pp} or 1"))
    if p_tp != d_tp and max(p_tp, d_tp) % min(p_tp, d_tp):
        # The rank mapping divides the larger attn TP by the smaller (common/conn.py:1452-1490).
        out.append(_err("PD_SGLANG_ATTN_TP", f"prefill attn TP {p_tp} and decode attn TP {d_tp}: SGLang maps "
                        "decode ranks onto prefill ranks by their whole ratio (disaggregation/common/conn.py:1452); "
                        "this one is not whole, so ranks pull the wrong shards", "roles.decode.parallel.tp",
                        "make one attn TP a multiple of the other"))
    for flag, why in SAME_ATTN_TP_FLAGS.items():
        if p_tp != d_tp and flag in t.engine.args:
            out.append(_err("PD_SGLANG_SAME_TP", f"prefill attn TP {p_tp} != decode attn TP {d_tp} with {flag}: {why}",
                            "roles.decode.parallel.tp", f"give both roles attn TP {p_tp}, or remove {flag}"))
    if dec.dcp > 1 and "--enable-kv-cache-sharding" in t.engine.args:
        out.append(_err("PD_SGLANG_DCP", f"decode dcp {dec.dcp} with --enable-kv-cache-sharding: \"PD decode DCP "
                        "does not support a prefill with --enable-kv-cache-sharding\" "
                        "(disaggregation/common/conn.py:1421)", "roles.decode.parallel.dcp",
                        "give decode dcp 1, or remove --enable-kv-cache-sharding"))
    if hybrid and p_tp != d_tp:
        out.append(_err("PD_STATE_RESLICE", f"prefill attn TP {p_tp} != decode attn TP {d_tp}: SGLang moves the "
                        "KDA state by TP-slicing it per head (\"Performance may be affected\", "
                        "disaggregation/mooncake/conn.py:2357); it works, but each state slot crosses in pieces",
                        "roles.decode.parallel.tp", f"equal attn TP ({p_tp}) moves each slot whole",
                        severity="info"))  # a supported layout (DP-attention decode), not a mistake
    return out


def _rehome(issue: Issue, role: str, inst: UnitInstance) -> Issue:
    """An instance plan's issue, pointed at the role's part of the file and named by role."""
    path = issue.path
    if path == "parallel" or path.startswith("parallel."):
        path = f"roles.{role}.{path}"
    elif (m := re.match(r"nodes\[(\d+)\](.*)", path)) is not None:
        path = f"nodes[{inst.nodes[int(m.group(1))]}]{m.group(2)}"
    named = path.startswith("roles.") or issue.code.startswith(("MEM_", "CONCURRENCY", "CONTEXT"))
    return issue._replace(path=path, message=f"{role}: {issue.message}" if named else issue.message)


def pd_plan(loaded: LoadedTopology, catalog: Catalog, unchecked: frozenset[str], facts: UnitFacts) -> Plan:
    """Plan a topology with `roles`: one instance of each role, the cross-role rules, the router in PD mode."""
    t = loaded.topology
    assert t.roles is not None and facts.layout.pd_family is not None
    insts = facts.layout.instances
    first = {role: next(i for i in insts if i.role == role) for role in ROLE_NAMES}
    subs: dict[str, Plan] = {}
    issues: list[Issue] = []
    for role in ROLE_NAMES:
        sub = plan_instance(LoadedTopology.of(first[role].topology, loaded.source), catalog, unchecked, facts,
                            first[role])
        subs[role] = sub
        for i in sub.issues:
            moved = _rehome(i, role, first[role])
            if moved[:4] not in [j[:4] for j in issues]:
                issues.append(moved)
    dec = subs["decode"]
    hybrid = dec.model is not None and bool(dec.model.architecture.kda_layers)
    issues += policy_issues(t, facts.router_policies) + cross_role_issues(t, hybrid, facts.layout.pd_family, facts.router_pd)
    gpus = {role: len(first[role].nodes) * t.hardware.gpus_per_node for role in ROLE_NAMES}
    router = None
    if t.router is not None and dec.model is not None and dec.hardware is not None:
        pre = subs["prefill"]
        eng = catalog.engines[facts.flavour] if facts.flavour is not None else None
        rp, router_issues = router_plan(t, catalog.planner.router_health_margin, longest_prefill(
            pre.topology, catalog, pre.model, pre.hardware, pre.shape, pre.family, eng), facts.layout.router_node,
            facts.worker_urls)
        issues += router_issues
        urls = list(zip(insts, facts.worker_urls, strict=True))
        settings = dataclasses.replace(
            rp.settings, prefill=tuple((url, i.bootstrap_port) for i, url in urls if i.role == "prefill"),
            decode=tuple(url for i, url in urls if i.role == "decode"))
        router = rp._replace(settings=settings)
    backend = t.roles.transfer.backend or BACKENDS.get(facts.layout.pd_family, ("nixl",))[0]
    groups = {"prefill": t.roles.prefill, "decode": t.roles.decode}
    pd = PdPlan(backend, *(RolePlan(role, groups[role].instances, gpus[role], subs[role]) for role in ROLE_NAMES))
    return dec._replace(file=loaded.file, topology=t, issues=tuple(locate(i, loaded) for i in issues),
                        router=router, pd=pd, instances=insts)


def instance_inputs(plan: Plan, inst: Instance, python: str = "python3") -> Inputs:
    """What the renderers take for one prefill or decode instance of a feasible PD plan."""
    assert plan.pd is not None
    return plan.instance_inputs(plan.instances[inst.number], python)
