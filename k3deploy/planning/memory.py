"""Per-GPU memory arithmetic: weights, MLA KV, KDA state, the engine's pool split, capacity."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from k3deploy.catalog.specs import DTYPE_BYTES, Architecture, DraftSpec, EngineDefaults, ModelSpec, ReplayRing
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.shape import Shape
from k3deploy.errors import InputError
from k3deploy.planning.arith import GIB, stage_layers
from k3deploy.planning.vision import VisionServing, tower_plan

BF16_BYTES = 2


def packed_mxfp4_bytes(elems: int) -> float:
    """MXFP4 payload: 4 bits per weight plus one E8M0 byte per 32 weights."""
    return elems * 4 / 8 + elems / 32


def bf16_bytes(elems: int) -> int:
    """BF16 payload."""
    return elems * BF16_BYTES


def mla_kv_bytes_per_token(arch: Architecture, kv_dtype: str, *, mla_layers: int | None = None, dcp: int = 1,
                           attn_tp: int = 1) -> float:
    """KV bytes per token per GPU of the full-attention layers. MLA: layers x (kv_lora_rank + rope dim) x
    dtype, sharded only by DCP. GQA: layers x K and V x the KV heads one TP rank holds (replicated when
    fewer than TP) x head_dim x dtype."""
    layers = len(arch.full_attn_layers) if mla_layers is None else mla_layers
    if arch.attention == "gqa":
        heads = math.ceil(arch.num_key_value_heads / attn_tp)
        return layers * 2 * heads * (arch.head_dim or 0) * DTYPE_BYTES[kv_dtype] / dcp
    return layers * (arch.kv_lora_rank + arch.qk_rope_head_dim) * DTYPE_BYTES[kv_dtype] / dcp


def kda_state_bytes_per_slot(
    arch: Architecture, attn_tp: int, ssm_dtype: str, conv_dtype: str = "bf16", *, kda_layers: int | None = None
) -> int:
    """KDA recurrent state per request slot per GPU: SSM state plus the q/k/v short-conv state."""
    layers = len(arch.kda_layers) if kda_layers is None else kda_layers
    heads = arch.kda_num_heads // attn_tp
    d = arch.kda_head_dim
    ssm = heads * d * d * DTYPE_BYTES[ssm_dtype]
    conv = (arch.short_conv_kernel_size - 1) * 3 * heads * d * DTYPE_BYTES[conv_dtype]
    return layers * (ssm + conv)


def kda_replay_ring_bytes(arch: Architecture, attn_tp: int, ring: ReplayRing, ring_len: int, conv_dtype: str = "bf16",
                          *, kda_layers: int | None = None) -> int:
    """SGLang ReplaySSM ring per state slot per GPU: `ring_len` records of a verify step's inputs per KDA layer
    (head_dim vectors per head in the conv dtype and in FP32, and FP32 scalars per head)."""
    layers = len(arch.kda_layers) if kda_layers is None else kda_layers
    heads = arch.kda_num_heads // attn_tp
    d = arch.kda_head_dim
    record = heads * (d * (ring.conv_vectors * DTYPE_BYTES[conv_dtype] + ring.fp32_vectors * 4) + ring.fp32_scalars * 4)
    return layers * ring_len * record


class StageLoad(NamedTuple):
    """What the heaviest pipeline stage holds."""

    layer_fraction: float
    mla_layers: int
    kda_layers: int


def heaviest_stage(arch: Architecture, pp: int) -> StageLoad:
    """Layer counts of the pipeline stage that holds the most of each kind."""
    stages = stage_layers(arch.num_hidden_layers, pp)
    mla, kda = set(arch.full_attn_layers), set(arch.kda_layers)
    return StageLoad(
        layer_fraction=max(len(s) for s in stages) / arch.num_hidden_layers,
        mla_layers=max(sum(1 for x in s if x in mla) for s in stages),
        kda_layers=max(sum(1 for x in s if x in kda) for s in stages),
    )


def weights_bytes_per_gpu(model: ModelSpec, shape: Shape, *, experts_bf16: bool = False) -> tuple[int, int]:
    """(routed-expert bytes, non-expert bytes) per GPU: routed / expert shards + rest / attention TP."""
    routed = model.weights.routed_expert_bytes
    if experts_bf16:  # an engine that dequantizes experts in memory (SGLang `auto` on Hopper)
        routed = bf16_bytes(model.architecture.routed_expert_elems)
    frac = heaviest_stage(model.architecture, shape.pp).layer_fraction
    return (math.ceil(routed / shape.expert_shards * frac),
            math.ceil(model.weights.non_expert_bytes / shape.attn_tp * frac))


def sglang_pool_ratio(slots: int, state_bytes: int, kv_bytes_per_token: float, avg_tokens: int,
                      draft_slots: int = 0, draft_kv_bytes: float = 0.0) -> float:
    """SGLang --mamba-full-memory-ratio = (S + D) x state / (L x (kv/dcp + draft kv))."""
    return (slots + draft_slots) * state_bytes / (avg_tokens * (kv_bytes_per_token + draft_kv_bytes))


def vllm_block_tokens(kda_page_bytes: float, attn_bytes_per_token: float, multiple: int) -> int:
    """vLLM hybrid block: the attention block grows until its page covers one KDA state page (a model
    without KDA layers keeps the base block)."""
    return multiple * max(1, math.ceil(kda_page_bytes / (multiple * attn_bytes_per_token)))


class MemoryBudget(NamedTuple):
    """Every per-GPU line item in bytes; the lines sum to usable memory exactly."""

    usable_bytes: int
    weights_bytes: int
    routed_weights_bytes: int
    non_expert_weights_bytes: int
    reserve_bytes: int
    kv_pool_bytes: int
    state_pool_bytes: int
    headroom_bytes: int
    mem_fraction: float
    mla_kv_bytes_per_token: float
    kda_state_bytes_per_slot: int
    slots_per_request: int
    pool_ratio: float | None = None
    block_tokens: int | None = None
    kv_tokens: int = 0
    state_requests: int = 0
    draft_weights_bytes: int = 0  # the speculative draft's weights / attn_tp (in weights_bytes)
    draft_kv_bytes_per_token: float = 0.0  # the draft's KV per token (each KV-pool token holds both)
    draft_slots: int = 0  # extra KDA state slots per request while speculating (in slots_per_request)
    replay_ring_bytes_per_slot: int = 0  # SGLang ReplaySSM ring each state slot carries (0: off)
    engine_static_bytes: int = 0  # resident beside the weights and pools when the pools are sized (SGLang)
    engine_preload_bytes: int = 0  # of which resident before the weights load (SGLang: outside its free share)
    vision_bytes: int = 0  # the vision tower's take from the pools beyond the non-expert line (planning/vision.py)

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value."""
        return self._asdict()


class MemoryInputs(NamedTuple):
    """The serving choices that size the caches."""

    family: EngineFamily
    engine: EngineDefaults
    reserve_bytes: int
    mem_fraction: float
    kv_dtype: str
    ssm_dtype: str
    prefix_cache: bool
    prefix_cache_strategy: str
    max_running_requests: int | None  # None: SGLang admits what its state pool holds
    avg_request_tokens: int | None = None
    pool_ratio: float | None = None  # None: the engine's own default, or the calculator's with pool_calculator
    pool_calculator: bool = False  # the SGLang K3 calculator's ratio (the topology asked for 'calculator')
    experts_bf16: bool = False
    drafts: int = 0  # speculative draft tokens per step: the draft's weights, KV and state slots count
    draft: DraftSpec | None = None  # the draft the flags name (None: the model's DSpark draft)
    replay_ring_len: int = 0  # SGLang --enable-linear-replayssm-spec: ring records per slot (0: off)
    vision: VisionServing | None = None  # the image settings (None: the vision tower is not counted)


def memory_budget(model: ModelSpec, usable_bytes: int, shape: Shape, inp: MemoryInputs) -> MemoryBudget:
    """Split one GPU's usable memory the way the engine will."""
    arch = model.architecture
    stage = heaviest_stage(arch, shape.pp)
    routed, rest = weights_bytes_per_gpu(model, shape, experts_bf16=inp.experts_bf16)
    draft = inp.draft or model.draft
    draft_w = math.ceil(draft.weights_bytes / shape.attn_tp) if inp.drafts and draft is not None else 0
    own_kv = draft.kv_bytes_per_token if draft is not None else None
    draft_kv = float(own_kv or inp.engine.draft_kv_bytes_per_token or 0) if inp.drafts else 0.0
    # SGLang keeps one intermediate KDA state per verified position (block + 1) of every running request;
    # with ReplaySSM it keeps none, and every slot carries the ring instead.
    replay = inp.engine.replay_ring if inp.drafts and inp.replay_ring_len else None
    extra = inp.drafts + 1 if inp.drafts and inp.engine.speculative_extra_slots and replay is None else 0
    weights = routed + rest + draft_w
    tower = tower_plan(model, inp.family, shape, inp.vision) if inp.vision is not None else None
    vision = tower.pool_bytes if tower is not None else 0
    kv_tok = mla_kv_bytes_per_token(arch, inp.kv_dtype, mla_layers=stage.mla_layers, dcp=shape.dcp,
                                    attn_tp=shape.attn_tp)
    state = kda_state_bytes_per_slot(arch, shape.attn_tp, inp.ssm_dtype, model.cache.conv_state_dtype,
                                     kda_layers=stage.kda_layers)
    slots_key = inp.prefix_cache_strategy if inp.prefix_cache else "disabled"
    if inp.family == "vllm":
        slots_key = "enabled" if inp.prefix_cache else "disabled"
    found = inp.engine.slots_per_request.get(slots_key)
    if found is None:  # only a --catalog file overriding the engine's defaults can drop a key
        have = ", ".join(sorted(inp.engine.slots_per_request)) or "none"
        raise InputError(f"catalog: engine {inp.family}: slots_per_request has no '{slots_key}' entry (it has "
                         f"{have})", hint="give every cache strategy of the engine its slots in the --catalog file")
    slots = found + extra
    ring = 0 if replay is None else kda_replay_ring_bytes(arch, shape.attn_tp, replay, inp.replay_ring_len,
                                                          model.cache.conv_state_dtype, kda_layers=stage.kda_layers)
    ratio: float | None = None
    block: int | None = None
    static_overhead = preload = 0
    if inp.family == "sglang":
        # SGLang sizes both pools from what is free after the load less (1 - mem_fraction_static) x what was free
        # before it (kv_cache_configurator.py _profile_available_bytes): everything resident at profiling time
        # comes out of the pools, and what was resident before the load (CUDA context, communicators) is outside
        # the share left free. What stays free after the pools is (1 - f) x (usable - preload).
        static_overhead = round((model.sglang_static_overhead_gib or 0.0) * GIB)
        preload = round((model.sglang_preload_overhead_gib or 0.0) * GIB)
        cache = max(0.0, (usable_bytes - preload) * inp.mem_fraction - weights - (static_overhead - preload) - vision)
        # Unless the topology asks otherwise, SGLang splits the pools by its own default ratio; a model without
        # KDA layers has no state pool to split off.
        default = inp.engine.mamba_full_memory_ratio_default if state and not inp.pool_calculator else None
        ratio = inp.pool_ratio or default or sglang_pool_ratio(found, state, kv_tok, inp.avg_request_tokens or inp.engine.avg_request_tokens or 1,
                                 draft_slots=extra, draft_kv_bytes=draft_kv)
        kv_pool = int(cache / (1 + ratio))
        state_pool = int(cache) - kv_pool
        state_per_request = slots * (state + ring)
    else:
        budget = usable_bytes * inp.mem_fraction
        cache = max(0.0, budget - weights - inp.reserve_bytes - vision)
        per_layer_tok = kv_tok / max(stage.mla_layers, 1)
        per_layer_state = state / max(stage.kda_layers, 1)
        block = vllm_block_tokens(per_layer_state, per_layer_tok, inp.engine.block_multiple_tokens or 128)
        # Each KDA state page is padded up to the attention page size of one block.
        state_per_request = slots * stage.kda_layers * math.ceil(block * per_layer_tok)
        assert inp.max_running_requests is not None, "vLLM sizes its state pool from --max-num-seqs"
        state_pool = min(int(cache), inp.max_running_requests * state_per_request)
        kv_pool = int(cache) - state_pool
    headroom = usable_bytes - weights - inp.reserve_bytes - kv_pool - state_pool - static_overhead - vision
    return MemoryBudget(
        usable_bytes=usable_bytes, weights_bytes=weights, routed_weights_bytes=routed,
        non_expert_weights_bytes=rest, reserve_bytes=inp.reserve_bytes, kv_pool_bytes=kv_pool,
        state_pool_bytes=state_pool, headroom_bytes=headroom, mem_fraction=inp.mem_fraction,
        mla_kv_bytes_per_token=kv_tok, kda_state_bytes_per_slot=state, slots_per_request=slots,
        pool_ratio=ratio, block_tokens=block,
        kv_tokens=int(kv_pool // (kv_tok + draft_kv)) if kv_tok else 0,
        # A model without KDA layers keeps no recurrent state: only the KV pool bounds its requests.
        state_requests=int(state_pool // state_per_request) if state_per_request else
        ((inp.max_running_requests or 0) if not arch.kda_layers else 0),
        draft_weights_bytes=draft_w, draft_kv_bytes_per_token=draft_kv, draft_slots=extra,
        replay_ring_bytes_per_slot=ring, engine_static_bytes=static_overhead, engine_preload_bytes=preload,
        vision_bytes=vision,
    )


def unaccounted_bytes(usable_bytes: int, reported_lines: dict[str, float]) -> float:
    """What a reported per-GPU split (in bytes) leaves unexplained of usable memory."""
    return usable_bytes - sum(reported_lines.values())
