"""The mimicked engine's own memory accounting at load, written from the engines' rules, not the planner's.

A stand-in never borrows the code it checks (STYLE rule 14): `k3deploy.planning` sizes memory to choose a
shape; this module sizes it the way SGLang and vLLM do when they load, so a planner bug shows up as a
disagreement in tests. Only catalog data (model sizes, engine defaults) is shared.

- Layout: SGLang shards attention over tp / attn-dp and experts over the whole TP group; vLLM shards
  attention over tp and experts over tp x dp with --enable-expert-parallel, else over tp.
- Weights per GPU: routed experts / expert shards + everything else / attention TP, times the share of
  layers the heaviest pipeline stage holds (earlier stages take the remainder).
- MLA KV per token: MLA layers of the stage x (kv_lora_rank + rope dim) x KV dtype, divided by DCP.
- KDA state per request slot: KDA layers x (heads x d x d x SSM dtype + (conv - 1) x 3 x heads x d x conv dtype).
- SGLang: cache = (usable - what was resident before the load) x mem_fraction_static - everything resident
  since, when the pools are sized (the weights and the model's sglang_static_overhead_gib less its
  sglang_preload_overhead_gib: kv_cache_configurator.py _profile_available_bytes), split full KV : state = 1 : --mamba-full-memory-ratio. vLLM: cache = usable x gpu_memory_utilization - weights - runtime
  reserve; the hybrid block grows until one attention page covers one KDA page; state takes
  max_num_seqs x slots x pages, KV the rest.
- The vision tower: the weights above count it / attention TP. SGLang builds K3's tower whole on every rank
  (models/kimi_k3.py: use_data_parallel = True), whatever the image limit; vLLM builds none when no image is allowed,
  the whole tower on every rank when TP does not divide its heads or --mm-encoder-tp-mode is data, else a TP shard,
  and its profile run keeps the embeddings of the largest images it encodes (max(1, min(max(batched tokens, T) // T,
  max_num_seqs x images a prompt holds)) of T tokens x hidden size, BF16) through the language model's peak, unless
  --skip-mm-profiling. What is held beyond the weights' share comes out of the caches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k3deploy.catalog.specs import DTYPE_BYTES, EngineDefaults, ModelSpec

BF16 = 2


@dataclass(frozen=True)
class Layout:
    """How one engine replica spreads the model over GPUs."""

    tp: int
    ep: int
    dp: int
    pp: int
    dcp: int
    attention_dp: bool
    attn_tp: int
    expert_shards: int
    experts_per_rank: int


@dataclass(frozen=True)
class Budget:
    """One GPU's memory as the engine splits it at load, in bytes (and what the caches hold)."""

    usable_bytes: int
    weights_bytes: int
    reserve_bytes: int
    kv_pool_bytes: int
    state_pool_bytes: int
    headroom_bytes: int
    mla_kv_bytes_per_token: float
    kda_state_bytes_per_slot: int
    slots_per_request: int
    block_tokens: int | None
    kv_tokens: int
    state_requests: int
    vision_bytes: int = 0  # the vision tower beyond the weights' share of it, and vLLM's profiled encoder outputs


@dataclass(frozen=True)
class Sizing:
    """The flags and defaults that size the caches."""

    mimic: str
    engine: EngineDefaults
    mem_fraction: float
    reserve_bytes: int
    kv_dtype: str
    ssm_dtype: str
    slots_per_request: int
    max_running_requests: int
    pool_ratio: float | None
    experts_bf16: bool
    images_per_request: int | None = None  # the engine's image limit (None: its default)
    encoder_data_parallel: bool = False  # vLLM --mm-encoder-tp-mode data
    skip_mm_profiling: bool = False  # vLLM --skip-mm-profiling
    batched_tokens: int | None = None  # vLLM --max-num-batched-tokens
    context_length: int = 0


def layout(
    mimic: str, *, tp: int, ep: int, dp: int, pp: int, dcp: int, attention_dp: bool, num_experts: int
) -> Layout:
    """The engine's sharding for these parallel flags."""
    if mimic == "sglang":
        attn_tp = tp // dp if attention_dp and dp > 0 and tp % dp == 0 else tp
        shards = tp
    else:
        attn_tp = tp
        shards = ep if ep > 1 else tp
    return Layout(tp, ep, dp, pp, dcp, attention_dp, attn_tp, shards, num_experts // max(ep, 1))


def _heaviest_stage(model: ModelSpec, pp: int) -> tuple[float, int, int]:
    """(layer share, MLA layers, KDA layers) of the stage holding the most of each."""
    arch = model.architecture
    base, extra = divmod(arch.num_hidden_layers, pp)
    mla, kda = set(arch.full_attn_layers), set(arch.kda_layers)
    first, most, most_mla, most_kda = 1, 0, 0, 0
    for stage in range(pp):
        layers = range(first, first + base + (stage < extra))
        first = layers.stop
        most = max(most, len(layers))
        most_mla = max(most_mla, sum(n in mla for n in layers))
        most_kda = max(most_kda, sum(n in kda for n in layers))
    return most / arch.num_hidden_layers, most_mla, most_kda


def weights_per_gpu(model: ModelSpec, lay: Layout, *, experts_bf16: bool = False) -> int:
    """Bytes of weights one GPU loads."""
    share = _heaviest_stage(model, lay.pp)[0]
    routed = model.weights.routed_expert_bytes
    if experts_bf16:  # dequantized experts: every weight becomes two bytes
        routed = model.architecture.routed_expert_elems * BF16
    return math.ceil(routed / lay.expert_shards * share) + math.ceil(
        model.weights.non_expert_bytes / lay.attn_tp * share
    )


def vision_resident(model: ModelSpec, lay: Layout, s: Sizing) -> int:
    """Bytes the vision tower holds per GPU beyond `weights_per_gpu`'s share of it, with vLLM's profiled outputs."""
    v = model.vision
    if v is None or v.params == 0:
        return 0
    tower = v.params * DTYPE_BYTES[v.dtype]
    share = math.ceil(tower / lay.attn_tp)
    if s.mimic == "sglang":
        return tower - share
    if s.images_per_request == 0:
        return 0
    held = tower if s.encoder_data_parallel or v.num_heads % lay.tp else math.ceil(tower / lay.tp)
    if s.skip_mm_profiling:
        return max(0, held - share)
    most = v.max_image_tokens
    in_prompt = s.context_length // most
    if s.images_per_request is not None:
        in_prompt = min(in_prompt, s.images_per_request)
    images = max(1, min(max(s.batched_tokens or 0, most) // most, s.max_running_requests * max(1, in_prompt)))
    return max(0, held - share) + images * most * model.architecture.hidden_size * DTYPE_BYTES[v.dtype]


def budget(model: ModelSpec, lay: Layout, usable_bytes: int, s: Sizing) -> Budget:
    """Split one GPU's memory as the engine does at load (never raises; pools may come out empty)."""
    arch = model.architecture
    _, mla_layers, kda_layers = _heaviest_stage(model, lay.pp)
    weights = weights_per_gpu(model, lay, experts_bf16=s.experts_bf16)
    vision = vision_resident(model, lay, s)
    kv_tok = mla_layers * (arch.kv_lora_rank + arch.qk_rope_head_dim) * DTYPE_BYTES[s.kv_dtype] / lay.dcp
    heads, d = arch.kda_num_heads // lay.attn_tp, arch.kda_head_dim
    conv = (arch.short_conv_kernel_size - 1) * 3 * heads * d * DTYPE_BYTES[model.cache.conv_state_dtype]
    state_slot = kda_layers * (heads * d * d * DTYPE_BYTES[s.ssm_dtype] + conv)
    block: int | None = None
    resident = 0
    if s.mimic == "sglang":
        resident = round((model.sglang_static_overhead_gib or 0.0) * (1 << 30))
        preload = round((model.sglang_preload_overhead_gib or 0.0) * (1 << 30))  # outside SGLang's free share
        cache = max(0.0, (usable_bytes - preload) * s.mem_fraction - weights - (resident - preload) - vision)
        ratio = s.pool_ratio or s.engine.mamba_full_memory_ratio_default or 1.0
        kv_pool = int(cache / (1 + ratio))
        state_pool = int(cache) - kv_pool
        per_request = s.slots_per_request * state_slot
    else:
        cache = max(0.0, usable_bytes * s.mem_fraction - weights - s.reserve_bytes - vision)
        kv_layer_tok = kv_tok / max(mla_layers, 1)
        state_layer = state_slot / max(kda_layers, 1)
        multiple = s.engine.block_multiple_tokens or 128
        block = multiple * math.ceil(state_layer / (multiple * kv_layer_tok))
        # Each KDA page is padded up to one attention page of the block.
        per_request = s.slots_per_request * kda_layers * math.ceil(block * kv_layer_tok)
        state_pool = min(int(cache), s.max_running_requests * per_request)
        kv_pool = int(cache) - state_pool
    return Budget(
        usable_bytes=usable_bytes,
        weights_bytes=weights,
        reserve_bytes=s.reserve_bytes,
        kv_pool_bytes=kv_pool,
        state_pool_bytes=state_pool,
        headroom_bytes=usable_bytes - weights - s.reserve_bytes - kv_pool - state_pool - resident - vision,
        mla_kv_bytes_per_token=kv_tok,
        kda_state_bytes_per_slot=state_slot,
        slots_per_request=s.slots_per_request,
        block_tokens=block,
        kv_tokens=int(kv_pool // kv_tok) if kv_tok else 0,
        state_requests=int(state_pool // per_request) if per_request else 0,
        vision_bytes=vision,
    )
