"""Load-time decisions: the MoE kernel the engine runs and whether the model fits (the engine's own rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import GIB, HardwareSpec, ModelSpec
from k3deploy.sim.engine_memory import Budget, Layout, Sizing, budget, layout
from k3deploy.sim.images import image_limit
from k3deploy.sim.serve_config import ServeConfig

Verdict = Literal["ok", "oom", "no_cache", "kv_short"]

BLACKWELL_MXFP4_LINE = (
    "Kimi-K3 on SM100/SM103/SM107: moe_runner_backend=flashinfer_mxfp4 (FlashInfer SiTU kernels)."
)
VLLM_ACTIVATION = "silu"
SGLANG_NO_MEMORY = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
VLLM_NO_CACHE = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine."
)
# vLLM logs its MXFP4 MoE backends by enum name, not by the --moe-backend spelling.
VLLM_MOE_NAMES = {"marlin": "MARLIN", "flashinfer_trtllm": "FLASHINFER_TRTLLM_MXFP4_BF16",
                  "flashinfer_cutlass": "FLASHINFER_CUTLASS_MXFP4_BF16", "triton": "TRITON"}
VLLM_FP4_MARLIN_WARNING = (
    "Your GPU does not have native support for FP4 computation but FP4 quantization is being used. "
    "Weight-only FP4 compression will be used leveraging the Marlin kernel. This may degrade performance for "
    "compute-heavy workloads."
)
_KV_DTYPES = {"auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}
_SSM_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class MoeChoice:
    """The MoE kernel the engine ends up running, its one log line (None: silent) and the expert dtype."""

    backend: str
    log_line: str | None
    experts_bf16: bool


@dataclass(frozen=True)
class Admission:
    """Load-time verdict with the numbers the engine's start-up lines print."""

    moe: MoeChoice
    shape: Layout
    budget: Budget
    hardware: HardwareSpec
    context_length: int
    max_running_requests: int
    verdict: Verdict
    error: str | None
    kv_dtype: str
    ssm_dtype: str


def _sm(hw: HardwareSpec) -> str:
    return hw.arch.upper() if hw.arch.startswith("sm") else hw.arch


def moe_choice(cfg: ServeConfig, hw: HardwareSpec, *, wrong_kernel: bool = False) -> MoeChoice:
    """Which MoE backend runs for K3's MXFP4 experts, as the mimicked engine resolves it."""
    asked = cfg.moe_backend
    if cfg.mimic == "vllm":
        if wrong_kernel:
            return MoeChoice(
                "triton",
                f"No Mxfp4 MoE backend supports activation={VLLM_ACTIVATION}. Falling back "
                "to 'triton' with BF16 activations.",
                False,
            )
        used = asked if asked != "auto" else ("flashinfer_trtllm" if hw.native_mxfp4 else "marlin")
        return MoeChoice(used, f"Using '{VLLM_MOE_NAMES.get(used, used.upper())}' Mxfp4 MoE backend.", False)
    if wrong_kernel:
        used = "triton" if asked != "triton" else "flashinfer_cutlass"
        return MoeChoice(used, f"Kimi-K3 on {_sm(hw)}: moe_runner_backend={used} (asked for {asked}).", False)
    if asked == "marlin":
        # Modelled on the Blackwell line: SGLang names the kernel K3's experts run on.
        return MoeChoice(
            "marlin", f"Kimi-K3 on {_sm(hw)}: moe_runner_backend=marlin (Marlin W4A16 kernels).", False
        )
    if hw.native_mxfp4 and asked in ("auto", "flashinfer_mxfp4"):
        return MoeChoice("flashinfer_mxfp4", BLACKWELL_MXFP4_LINE, False)
    # SGLang `auto` (or any non-MXFP4 kernel) without FP4 tensor cores dequantizes experts to BF16, silently.
    return MoeChoice("triton" if asked == "auto" else asked, None, not hw.native_mxfp4)


def _sizing(cfg: ServeConfig, model: ModelSpec, hw: HardwareSpec, experts_bf16: bool) -> Sizing:
    catalog = load_catalog()
    engine = catalog.engines[cfg.mimic]
    reserve_gib = (
        hw.runtime_reserve_gib if hw.runtime_reserve_gib is not None else catalog.planner.runtime_reserve_gib
    )
    kv = _KV_DTYPES.get(cfg.kv_cache_dtype, "fp8")  # every other choice is an 8-bit (or smaller) format
    if cfg.mimic == "sglang":
        slots_key = cfg.radix_cache_strategy if cfg.prefix_cache else "disabled"
    else:
        slots_key = "enabled" if cfg.prefix_cache else "disabled"
    return Sizing(
        mimic=cfg.mimic,
        engine=engine,
        mem_fraction=cfg.mem_fraction or engine.default_mem_fraction,
        reserve_bytes=round(reserve_gib * GIB),
        kv_dtype=kv or model.cache.kv_cache_dtype,
        ssm_dtype=_SSM_DTYPES.get(cfg.ssm_dtype or "", model.cache.ssm_state_dtype),
        slots_per_request=engine.slots_per_request[slots_key],
        max_running_requests=cfg.max_running_requests or 1,
        pool_ratio=cfg.pool_ratio if cfg.mimic == "sglang" else None,
        experts_bf16=experts_bf16,
        images_per_request=image_limit(cfg.args),
        encoder_data_parallel=cfg.args.get("mm_encoder_tp_mode") == "data",
        skip_mm_profiling=bool(cfg.args.get("skip_mm_profiling")),
        batched_tokens=cfg.chunked_prefill_size if cfg.mimic == "vllm" else None,
        context_length=cfg.context_length or model.architecture.max_position_embeddings,
    )


def engine_shape(cfg: ServeConfig, model: ModelSpec) -> Layout:
    """The parallel layout the flags describe."""
    return layout(
        cfg.mimic,
        tp=cfg.tp,
        ep=cfg.ep,
        dp=cfg.dp,
        pp=cfg.pp,
        dcp=cfg.dcp,
        attention_dp=cfg.attention_dp,
        num_experts=model.architecture.num_experts,
    )


def _error(
    cfg: ServeConfig, verdict: Verdict, b: Budget, hw: HardwareSpec, ctx: int, moe_layers: int
) -> str | None:
    if verdict == "oom":
        return oom_line(b, hw, moe_layers)
    if verdict == "no_cache":
        return SGLANG_NO_MEMORY if cfg.mimic == "sglang" else VLLM_NO_CACHE
    if verdict == "kv_short":
        if cfg.mimic == "sglang":
            return f"{SGLANG_NO_MEMORY} (max_total_num_tokens={b.kv_tokens} < context_len={ctx})"
        need = ctx * b.mla_kv_bytes_per_token / GIB
        return (
            "ValueError: To serve at least one request with the models's max seq len "
            f"({ctx}), ({need:.2f} GiB "
            f"KV cache is needed, which is larger than the available KV cache memory "
            f"({b.kv_pool_bytes / GIB:.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {b.kv_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
            "when initializing the engine."
        )
    return None


def oom_line(b: Budget, hw: HardwareSpec, moe_layers: int = 1) -> str:
    """PyTorch's CUDA out-of-memory message for loading these weights layer by layer on this GPU."""
    chunk = b.weights_bytes / max(moe_layers, 1)
    if b.weights_bytes > b.usable_bytes:  # loading stops at the first layer that no longer fits
        used = math.floor(b.usable_bytes / chunk) * chunk
        tried = chunk
    else:  # weights fit; the runtime reserve (activations, graphs) is what runs out
        used = b.weights_bytes
        tried = b.usable_bytes - used + b.reserve_bytes
    free = b.usable_bytes - used
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. "
        f"GPU 0 has a total capacity of {hw.memory_gib:.2f} GiB of which {free / GIB:.2f} GiB is free. "
        f"Including non-PyTorch memory, this process has {used / GIB:.2f} GiB memory in use. "
        f"Of the allocated memory {used / GIB:.2f} GiB is allocated by PyTorch, "
        "and 0.00 GiB is reserved by PyTorch but unallocated."
    )


def admit(cfg: ServeConfig, model: ModelSpec, hw: HardwareSpec, *, wrong_kernel: bool = False) -> Admission:
    """Resolve the MoE kernel and size one GPU's memory the way the engine will; never raises."""
    moe = moe_choice(cfg, hw, wrong_kernel=wrong_kernel)
    shape = engine_shape(cfg, model)
    sizing = _sizing(cfg, model, hw, moe.experts_bf16)
    b = budget(model, shape, hw.usable_bytes, sizing)
    ctx = cfg.context_length or model.architecture.max_position_embeddings
    verdict: Verdict = "ok"
    if b.weights_bytes + b.reserve_bytes > b.usable_bytes:
        verdict = "oom"
    elif b.kv_pool_bytes <= 0 or b.state_requests < 1:
        verdict = "no_cache"
    elif b.kv_tokens < ctx:
        verdict = "kv_short"
    running = cfg.max_running_requests or b.state_requests
    if cfg.mimic == "sglang":
        running = min(running, b.state_requests) or running
    return Admission(
        moe=moe,
        shape=shape,
        budget=b,
        hardware=hw,
        context_length=ctx,
        max_running_requests=max(running, 1),
        verdict=verdict,
        error=_error(cfg, verdict, b, hw, ctx, model.architecture.moe_layers),
        kv_dtype=sizing.kv_dtype,
        ssm_dtype=sizing.ssm_dtype,
    )
