"""Legality rules: each failure is an Issue with a stable code and the arithmetic behind it."""
from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterator

from k3deploy.catalog.specs import Architecture, HardwareSpec, ModelSpec
from k3deploy.diagnostics import Issue
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.shape import Shape
from k3deploy.planning.arith import factorize
from k3deploy.topology.schema import Topology


def _err(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="error", message=message, path=path, hint=hint)


def _warn(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="warning", message=message, path=path, hint=hint)


def tp_divisibility(arch: Architecture, tp: int, path: str = "parallel.tp") -> Iterator[Issue]:
    """TP must divide attention heads, hidden size, vocab and KDA heads."""
    checks = (
        ("TP_HEADS", "attention heads", arch.num_attention_heads),
        ("TP_HIDDEN", "hidden", arch.hidden_size),
        ("TP_VOCAB", "vocab", arch.vocab_size),
        ("TP_KDA_HEADS", "KDA heads", arch.kda_num_heads),
    )
    for code, what, n in checks:
        if n % tp:
            yield _err(code, f"tp={tp} does not divide {what} {n} = {factorize(n)}", path)


def parallel_rules(arch: Architecture, family: EngineFamily, s: Shape) -> Iterator[Issue]:
    """Divisibility and the engine's own parallel rules."""
    yield from tp_divisibility(arch, s.tp)
    if arch.num_experts % s.ep:
        yield _err("EP_EXPERTS", f"ep={s.ep} does not divide routed experts {arch.num_experts} = "
                   f"{factorize(arch.num_experts)}", "parallel.ep")
    if family == "sglang":
        if s.tp % s.ep:
            yield _err("EP_NOT_IN_TP", f"ep={s.ep} does not divide tp={s.tp} (SGLang's EP lives inside TP)",
                       "parallel.ep")
        if s.dp > 1 and not s.attention_dp:
            yield _err("SGLANG_DP_REPLICAS", f"dp={s.dp} without attention_dp runs {s.dp} independent "
                       "replicas; k3deploy plans one replica", "parallel.dp",
                       "set attention_dp: true for DP attention inside TP, or dp: 1")
        if s.attention_dp and s.tp % s.dp:
            yield _err("DP_NOT_IN_TP", f"dp={s.dp} does not divide tp={s.tp} (attn_tp = tp / dp)", "parallel.dp")
    else:
        if s.ep not in (1, s.tp * s.dp):
            yield _err("EP_VLLM", f"ep={s.ep}: vLLM's expert parallel is EP = tp x dp = {s.tp * s.dp} "
                       "(or 1 with experts tensor-sharded)", "parallel.ep")
        if s.attention_dp:
            yield _warn("VLLM_ATTENTION_DP", "vLLM has no attention_dp switch: dp > 1 already replicates "
                        "attention", "parallel.attention_dp")
        if s.dp > 1 and (s.gpus_per_node % (s.tp * s.pp)):
            yield _err("VLLM_DP_SPANS_NODES", f"dp={s.dp} with tp x pp = {s.tp * s.pp} per DP rank does not fit "
                       f"whole on a {s.gpus_per_node}-GPU node; vLLM's per-node DP form needs tp x pp to divide "
                       "gpus_per_node (the --nnodes form cannot be mixed with DP ranks)", "parallel.dp")
    if s.attn_tp and s.attn_tp % s.dcp:
        yield _err("DCP_ATTN_TP", f"dcp={s.dcp} does not divide attention TP {s.attn_tp}", "parallel.dcp")
    if s.pp > arch.num_hidden_layers:
        yield _err("PP_LAYERS", f"pp={s.pp} exceeds the {arch.num_hidden_layers} layers", "parallel.pp")
    gpus = s.nnodes * s.gpus_per_node
    if gpus != s.world_size:
        rule = "tp x pp" if family == "sglang" else "tp x pp x dp"
        # Suggest a node count only for a shape that is legal: more nodes never make an illegal tp legal.
        legal = not any(i.code.startswith("TP_") for i in tp_divisibility(arch, s.tp))
        hint = (f"use {s.world_size // s.gpus_per_node} nodes or change the shape"
                if legal and s.world_size % s.gpus_per_node == 0 else
                f"choose a legal shape: `k3deploy plan --search --hardware GPU --gpus {gpus}` lists them")
        yield _err("WORLD_SIZE", f"{s.nnodes} nodes x {s.gpus_per_node} GPUs = {gpus}, but the engine's world "
                   f"size {rule} = {s.world_size}", "nodes", hint)


def node_rules(t: Topology) -> Iterator[Issue]:
    """Ranks unique and contiguous; addresses usable for rendezvous."""
    explicit = [n.rank for n in t.nodes if n.rank is not None]
    if explicit and len(explicit) != len(t.nodes):
        yield _err("RANKS_PARTIAL", "either every node has `rank` or none does", "nodes")
    elif explicit:
        dup = [r for r, c in Counter(explicit).items() if c > 1]
        if dup:
            yield _err("RANKS_DUPLICATE", f"rank(s) {dup} given to more than one node", "nodes")
        elif sorted(explicit) != list(range(len(t.nodes))):
            yield _err("RANKS_GAP", f"ranks {sorted(explicit)} are not contiguous from 0 to {len(t.nodes) - 1}",
                       "nodes")
    local = t.launch.nodes_are_here
    for i, n in enumerate(t.nodes):
        ip = ipaddress.ip_address(n.ip)
        if ip.is_unspecified:
            yield _err("IP_UNSPECIFIED", f"{n.ip} is not a rendezvous address", f"nodes[{i}].ip")
        elif ip.is_loopback and not local:
            what = "the rendezvous address" if (n.rank or i) == 0 else "a node address"
            yield _err("IP_LOOPBACK", f"{n.ip} is loopback: {what} must be the node's private IP, or other "
                       "nodes dial themselves", f"nodes[{i}].ip", "use the IP on the private interface")
    if not local:
        for field in ("ip", "host"):
            counts = Counter(getattr(n, field) for n in t.nodes)
            for i, n in enumerate(t.nodes):
                if counts[getattr(n, field)] > 1:
                    yield _err(f"DUPLICATE_{field.upper()}", f"{getattr(n, field)} is used by more than one node",
                               f"nodes[{i}].{field}")
                    counts[getattr(n, field)] = 0


def pairing_rules(t: Topology, model: ModelSpec, hw: HardwareSpec) -> Iterator[Issue]:
    """Model, accelerator and engine that cannot work together; an unpinned revision."""
    yield from pairing_issues(t.engine.kind, model, hw)
    if t.model.revision is None:
        yield _warn("REVISION_UNPINNED", "no model revision pinned; several revisions circulate",
                    "model.revision", "pin the hub commit sha")


def pairing_issues(kind: str, model: ModelSpec, hw: HardwareSpec) -> Iterator[Issue]:
    """Model, accelerator and engine kind that cannot work together (`plan FILE` and `plan --search` alike)."""
    if hw.vendor == "huawei" and kind not in ("vllm-ascend", "sim"):
        yield _err("ENGINE_HARDWARE", f"{hw.name} needs the vLLM-Ascend engine, not {kind}", "engine.kind")
    if kind == "vllm-ascend" and hw.vendor != "huawei":
        yield _err("ENGINE_HARDWARE", f"vllm-ascend runs on Ascend NPUs, not {hw.name}", "engine.kind")
    if hw.vendor == "huawei" and model.weights.expert_format == "mxfp4":
        yield _err("ASCEND_NEEDS_W4A8", f"{hw.name} has no MXFP4 kernels", "model.id",
                   "use the W4A8 checkpoint: model.id kimi-k3-w4a8")
    if model.quantization == "ascend" and kind not in ("vllm-ascend", "sim"):
        yield _err("QUANT_ASCEND", f"{model.id} needs --quantization ascend, which only vLLM-Ascend has "
                   "(vanilla vLLM fails: 'Unknown quantization method: ascend')", "model.id")


def budget_rules(t: Topology) -> Iterator[Issue]:
    """Validate's request budgets that cannot fit serving.context_length (a small test model's context):
    the stages would send requests the engine refuses (HTTP 400) instead of checking anything."""
    v, ctx = t.validate_, t.serving.context_length
    hint = "lower the validate.* budgets named, or raise serving.context_length"
    if ctx - v.answer_max_tokens < v.cache_block_tokens:
        yield _warn("VALIDATE_LONG_ROOM", f"validate.answer_max_tokens {v.answer_max_tokens:,} leaves "
                    f"{max(ctx - v.answer_max_tokens, 0):,} of serving.context_length {ctx:,} for the long "
                    f"stage's prompt (less than one cache block of {v.cache_block_tokens:,})",
                    "validate.answer_max_tokens", hint)
    if 2 * v.answer_max_tokens + 2 * v.cache_block_tokens > ctx:
        yield _warn("VALIDATE_PREFIX_ROOM", f"the prefix-cache stage needs 2 x validate.answer_max_tokens "
                    f"{v.answer_max_tokens:,} + two cache blocks of {v.cache_block_tokens:,} = "
                    f"{2 * v.answer_max_tokens + 2 * v.cache_block_tokens:,} tokens, more than "
                    f"serving.context_length {ctx:,}", "validate.answer_max_tokens", hint)
    prompt = max(v.effort_prompt_tokens, 2 * v.cache_block_tokens)
    if prompt + v.effort_max_tokens > ctx:
        yield _warn("VALIDATE_EFFORT_ROOM", f"an effort request's prompt ({prompt:,} tokens: "
                    f"validate.effort_prompt_tokens, at least 2 x cache_block_tokens) + validate.effort_max_tokens "
                    f"{v.effort_max_tokens:,} exceed serving.context_length {ctx:,}", "validate.effort_max_tokens",
                    hint)


def seed_rules(t: Topology, model: ModelSpec) -> Iterator[Issue]:
    """Serving settings the seeds name as failure modes: a context past the model's, a distributed-init timeout
    shorter than the checkpoint's load, prefix caching off."""
    arch, ctx = model.architecture, t.serving.context_length
    if ctx > arch.max_position_embeddings:
        yield _err("CONTEXT_OVER_MODEL", f"context_length {ctx:,} is past {model.id}'s maximum of "
                   f"{arch.max_position_embeddings:,} tokens (max_position_embeddings): the engine refuses to start "
                   "or serves positions the model never saw", "serving.context_length",
                   f"at most {arch.max_position_embeddings:,}; start at 32K-128K (the K3 guide, section 41.3)")
    need = model.load_dist_timeout_s
    if need is not None and len(t.nodes) > 1 and t.launch.dist_timeout_s < need:
        yield _warn("DIST_TIMEOUT_SHORT", f"dist_timeout_s {t.launch.dist_timeout_s} is shorter than the "
                    f"{need} s a multi-node load of {model.id} ({model.weights.total_bytes / 2**40:.2f} TiB) needs: "
                    "the distributed init times out before the model is ready", "launch.dist_timeout_s",
                    f"set launch.dist_timeout_s: {need} (the cookbook's --dist-timeout)")
    if not t.serving.prefix_cache:
        yield _warn("PREFIX_CACHE_OFF", "prefix caching is off: every turn of every conversation pays its full "
                    "prefill (invisible in correctness, brutal in cost and time to first token)",
                    "serving.prefix_cache", "set serving.prefix_cache: true")
