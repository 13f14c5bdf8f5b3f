"""The vision tower's memory per GPU, where each engine keeps it and what it takes from the caches. Pure.

vLLM (vllm-project/vllm vllm/models/kimi_k3/nvidia/model.py @ed51064c, KimiK3ForConditionalGeneration.__init__):
the MoonViT tower and projector are built in BF16 inside `_mark_tower_model(vllm_config, "image")`, which skips
them when --limit-mm-per-prompt allows no image; `use_data_parallel = is_vit_use_data_parallel(num_attention_heads)`
(vllm/model_executor/models/vision.py: "Falling back to data parallelism for the vision encoder" when TP does not
divide the heads), and --mm-encoder-tp-mode data asks for the same: every rank then holds the whole tower, else its
linear layers are TP-sharded (kimi_k25_vit.py, disable_tp=use_data_parallel). vLLM's KV pool is what is left of
gpu_memory_utilization x total after `memory_profiling` (vllm/v1/worker/gpu_worker.py @35d5cda1,
Worker.determine_available_memory: requested_memory - non_kv_cache_memory), whose weights term is the model's
loaded bytes (model_memory_usage, the rank's tower share included) and whose peak is the profile run's. That run
(gpu_model_runner.py profile_run; vllm/v1/worker/gpu/mm/encoder_profile.py @32afae6e, _compute_encoder_cache_budget)
encodes max(1, min(budget // T, max_num_seqs x max(1, min(image limit, max_model_len // T)))) dummy images of the
processor's largest feature size T (KimiK3DummyInputsBuilder: get_max_image_size, mm_preprocess.py @25c255b9) with
budget = max(--max-num-batched-tokens, T) (compute_mm_encoder_budget), and keeps their embeddings (T tokens x the
text hidden size, BF16) in the encoder cache while the language model's dummy batch runs, so they add to its peak;
--skip-mm-profiling skips that. The encoder's own activations are freed before the language model's dummy run, so
they stay under its peak (the runtime reserve). Its encoder CUDA graphs are not counted here: at 35d5cda1 they are
captured after the KV cache is sized (out of the headroom); a vLLM whose profiler estimates CUDA graph memory
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS) charges graphs to the pool, inside the runtime reserve's share.

SGLang (sgl-project/sglang python/sglang/srt/models/kimi_k3.py @e44a41c1, KimiK3ForConditionalGeneration.__init__:
"The dedicated K3 tower runs replicated (per-rank full weights)", use_data_parallel = True; kimi_k3_vl.py @3633343
builds it of plain nn.Linear layers): the whole tower on every rank, built whatever the image limit and loaded with
the weights, so inside what mem_fraction_static's profile charges to the pools (kv_cache_configurator.py
_profile_available_bytes). It reserves nothing per image at start beyond the catalog's calibrated static memory
(mm_runtime_reservation_gb's VLM cache and feature pool).

The checkpoint's non-expert bytes already hold the tower, counted / attention TP in the budget; what an engine keeps
beyond that share, and vLLM's profiled encoder outputs, come out of the caches (`pool_bytes`)."""
from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

from k3deploy.catalog.specs import DTYPE_BYTES, ModelSpec
from k3deploy.engines.kinds import Family
from k3deploy.engines.shape import Shape
from k3deploy.topology.schema import Topology

Placement = Literal["sharded", "replicated", "skipped", "absent"]


class VisionServing(NamedTuple):
    """The serving settings that decide where the engine keeps the tower and what its profile run holds."""

    images_per_request: int | None  # None: the engine's default limit
    encoder_data_parallel: bool = False  # vLLM --mm-encoder-tp-mode data
    skip_profiling: bool = False  # vLLM --skip-mm-profiling
    batched_tokens: int | None = None  # vLLM --max-num-batched-tokens (None: its default, below one largest image)
    max_running_requests: int = 1
    context_length: int = 0


class VisionPlan(NamedTuple):
    """The vision tower on one GPU."""

    tower_bytes: int  # the whole tower and projector (BF16)
    per_gpu_bytes: int  # what one rank holds
    counted_bytes: int  # what the budget's non-expert weights line already counts of it (tower / attention TP)
    placement: Placement
    why: str
    profile_bytes: int = 0  # vLLM: the encoder outputs its profile run holds through the language model's peak
    profile_images: int = 0  # how many largest images that run encodes

    @property
    def extra_bytes(self) -> int:
        """What the engine holds per GPU beyond the budget's share (0 when sharded or skipped)."""
        return max(0, self.per_gpu_bytes - self.counted_bytes)

    @property
    def pool_bytes(self) -> int:
        """What the tower takes from the KV and state pools beyond the non-expert line."""
        return self.extra_bytes + self.profile_bytes

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value, the extra and pool bytes included."""
        return {**self._asdict(), "extra_bytes": self.extra_bytes, "pool_bytes": self.pool_bytes}


def vision_serving(t: Topology) -> VisionServing:
    """The topology's settings that `tower_plan` reads."""
    args = t.engine.args
    batched = args.get("--max-num-batched-tokens")
    return VisionServing(
        images_per_request=t.serving.images_per_request,
        encoder_data_parallel=str(args.get("--mm-encoder-tp-mode", "")) == "data",
        skip_profiling=args.get("--skip-mm-profiling") not in (None, False, "false", "False"),
        batched_tokens=int(batched) if isinstance(batched, (int, str)) and str(batched).isdigit() else None,
        max_running_requests=t.serving.max_running_requests or 1,
        context_length=t.serving.context_length)


def vision_plan(t: Topology, model: ModelSpec, family: Family, shape: Shape) -> VisionPlan | None:
    """Where the engine keeps `model`'s vision tower and what it costs per GPU (None: a text-only model)."""
    return tower_plan(model, family, shape, vision_serving(t))


def tower_plan(model: ModelSpec, family: Family, shape: Shape, vs: VisionServing) -> VisionPlan | None:
    """`vision_plan` from the settings alone (the memory budget's entry)."""
    v = model.vision
    if v is None:
        return None
    tower = v.params * DTYPE_BYTES[v.dtype]
    counted = math.ceil(tower / shape.attn_tp)
    if tower == 0:
        return VisionPlan(0, 0, counted, "absent", "the checkpoint has no vision tower")
    if family != "vllm":
        return VisionPlan(tower, tower, counted, "replicated", "SGLang runs K3's tower replicated (plain linear "
                          "layers, the whole tower on every rank), loaded with the weights: out of the pools")
    if vs.images_per_request == 0:
        return VisionPlan(tower, 0, counted, "skipped", "serving.images_per_request 0: vLLM does not build the "
                          "tower when --limit-mm-per-prompt allows no image")
    images, profile = _profiled(model, vs)
    if vs.encoder_data_parallel:
        return VisionPlan(tower, tower, counted, "replicated", "--mm-encoder-tp-mode data: every rank runs the "
                          "whole tower on its own images", profile, images)
    if v.num_heads % shape.tp:
        return VisionPlan(tower, tower, counted, "replicated", f"{v.num_heads} encoder heads do not divide over "
                          f"TP {shape.tp}: vLLM falls back to data parallelism, the whole tower on every rank",
                          profile, images)
    return VisionPlan(tower, math.ceil(tower / shape.tp), counted, "sharded",
                      f"{v.num_heads} encoder heads over TP {shape.tp}: vLLM shards the tower's linear layers",
                      profile, images)


def _profiled(model: ModelSpec, vs: VisionServing) -> tuple[int, int]:
    """(largest images vLLM's profile run encodes, bytes of their embeddings it holds) per GPU."""
    v = model.vision
    assert v is not None
    if vs.skip_profiling:
        return 0, 0
    most = v.max_image_tokens
    budget = max(vs.batched_tokens or 0, most)
    fit = vs.context_length // most  # images of that size one prompt holds
    per_request = max(1, fit if vs.images_per_request is None else min(vs.images_per_request, fit))
    images = max(1, min(budget // most, vs.max_running_requests * per_request))
    return images, images * most * model.architecture.hidden_size * DTYPE_BYTES[v.dtype]
