"""The mimicked engine's start-up messages (its own format strings), filled from the admission."""

from __future__ import annotations

from k3deploy.catalog.specs import DTYPE_BYTES, GIB, HardwareSpec, ModelSpec
from k3deploy.sim.admission import Admission
from k3deploy.sim.engine_args import engine_defaults
from k3deploy.sim.log_format import Ranks
from k3deploy.sim.serve_config import ServeConfig

MODEL_CLASS = "KimiK3ForConditionalGeneration"
SGLANG_DEFAULT_CHUNKED_PREFILL = 8192
FLASHMLA_PAGE_LINE = "FlashMLA only supports a page_size of 64, change page_size to 64."
_TORCH_DTYPES = {
    "bf16": "torch.bfloat16",
    "fp16": "torch.float16",
    "fp8": "torch.float8_e4m3fn",
    "fp32": "torch.float32",
}
_TRACEBACK = {
    "sglang": (
        '  File "sglang/srt/managers/scheduler.py", line 3012, in run_scheduler_process\n'
        '  File "sglang/srt/model_executor/model_runner.py", line 862, in load_model'
    ),
    "vllm": (
        '  File "vllm/v1/engine/core.py", line 726, in run_engine_core\n'
        '  File "vllm/v1/worker/gpu_model_runner.py", line 3120, in load_model'
    ),
}


def _gb(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def sglang_default_attention(hw: HardwareSpec) -> str:
    """The attention backend SGLang picks for an MLA model when none is given."""
    if hw.arch == "sm90":
        return "fa3"
    if hw.arch.startswith("sm10"):
        return "trtllm_mla"
    return "aiter" if hw.vendor == "amd" else "triton"


def sglang_attention_line(cfg: ServeConfig, hw: HardwareSpec) -> str | None:
    """SGLang's note when --attention-backend is unset (None when it was given)."""
    if cfg.args.get("attention_backend"):
        return None
    return f"Attention backend not explicitly specified. Use {sglang_default_attention(hw)} backend by default."


def server_args_line(cfg: ServeConfig, hw: HardwareSpec, moe_backend: str) -> str:
    """SGLang's `server_args=ServerArgs(...)` dump (every resolved argument) or vLLM's `non-default args` line."""
    if cfg.mimic == "sglang":
        resolved = {**cfg.args, "moe_runner_backend": moe_backend,
                    "attention_backend": cfg.args.get("attention_backend") or sglang_default_attention(hw)}
        inner = ", ".join(f"{k}={v!r}" for k, v in resolved.items() if k != "mimic")
        return f"server_args=ServerArgs({inner})"
    defaults = engine_defaults(cfg.mimic)
    changed = {k: v for k, v in cfg.args.items() if k in defaults and v != defaults[k] and k != "mimic"}
    return f"non-default args: {changed}"


def vllm_attention_line(cfg: ServeConfig, hw: HardwareSpec) -> str:
    """vLLM's attention backend choice for an MLA model on this accelerator."""
    if hw.arch == "sm90":
        candidates = ["FLASHMLA", "FLASH_ATTN_MLA", "TRITON_MLA"]
    elif hw.arch.startswith("sm10"):
        candidates = ["FLASHINFER_MLA", "CUTLASS_MLA", "TRITON_MLA"]
    else:
        candidates = ["TRITON_MLA"]
    used = (cfg.decode_attention_backend or candidates[0]).upper()
    return f"Using {used} attention backend out of potential backends: {candidates}"


def failure_block(cfg: ServeConfig, exception_line: str) -> str:
    """The engine's crash report: its heading, a short traceback and the exception line."""
    heading = (
        "Scheduler hit an exception: Traceback (most recent call last):"
        if cfg.mimic == "sglang"
        else ("EngineCore failed to start.\nTraceback (most recent call last):")
    )
    return f"{heading}\n{_TRACEBACK[cfg.mimic]}\n{exception_line}"


def vllm_headless_line(cfg: ServeConfig) -> str:
    """vLLM's headless launch line for the multi-node form in use."""
    host = cfg.rendezvous.host
    if int(cfg.args.get("nnodes", 1) or 1) > 1:
        return (
            f"Launching vLLM (v{cfg.version}) headless multiproc executor, with head node address {host} "
            "for torch.distributed process group."
        )
    local = cfg.args.get("data_parallel_size_local") or 1
    return f"Launching {local} data parallel engine(s) in headless mode, with head node address {host}."


def vllm_rank_lines(cfg: ServeConfig, ranks: Ranks, init_method: str) -> list[str]:
    """vLLM's world and rank-assignment lines for the node's first GPU."""
    world = (
        f"world_size={ranks.world_size} rank={ranks.world_rank} local_rank=0 "
        f"distributed_init_method={init_method} backend=gloo"
    )
    # vLLM gives every MoE model an EP group spanning DP x TP, expert parallelism on or not (its ranks are
    # DP-major); a dense model gets none and logs `EP rank N/A`. The stand-in's models are all MoE. ETP equals
    # the TP rank as real vLLM 0.32 logs it at EP 1; EPLB has a group only with --enable-eplb (never here).
    ep_rank = ranks.dp * cfg.tp + ranks.tp
    assigned = (
        f"rank {ranks.world_rank} in world size {ranks.world_size} is assigned as DP rank {ranks.dp}, "
        f"PP rank {ranks.pp}, PCP rank 0, TP rank {ranks.tp}, ETP rank {ranks.tp}, EP rank {ep_rank}, "
        "EPLB rank N/A"
    )
    return [world, assigned]


def vllm_ep_line(adm: Admission, ranks: Ranks, model: ModelSpec) -> str | None:
    """vLLM's expert-parallel line (None without --enable-expert-parallel)."""
    ep, experts = adm.shape.ep, model.architecture.num_experts
    if ep <= 1:
        return None
    local = experts // ep
    first = ranks.ep * local
    return (
        f"[EP Rank {ranks.ep}/{ep}] Expert parallelism is enabled. Expert placement strategy: linear. "
        f"Local/global number of experts: {local}/{experts}. Experts local to global index map: "
        f"0->{first}, ..., {local - 1}->{first + local - 1}."
    )


def vllm_block_line(adm: Admission) -> str:
    """vLLM's hybrid-cache block size line."""
    return (
        f"Setting attention block size to {adm.budget.block_tokens} tokens to ensure that attention page "
        "size "
        "is >= mamba page size."
    )


def vllm_load_lines(adm: Admission, elapsed_s: float) -> list[str]:
    """vLLM's model-loading and available-KV-memory lines."""
    b = adm.budget
    return [
        f"Model loading took {b.weights_bytes / GIB:.4f} GiB memory and {elapsed_s:.6f} seconds",
        f"Available KV cache memory: {_gb(b.kv_pool_bytes + b.state_pool_bytes)} GiB",
    ]


def vllm_kv_size_line(adm: Admission) -> str:
    """vLLM's KV capacity line."""
    b = adm.budget
    concurrency = b.kv_tokens / adm.context_length if adm.context_length else 0.0
    return (
        f"GPU KV cache size: {b.kv_tokens:,} tokens, Maximum concurrency for "
        f"{adm.context_length:,} tokens per "
        f"request: {concurrency:.2f}x"
    )


def sglang_load_begin(adm: Admission) -> str:
    """SGLang's weight-load start line."""
    return f"Load weight begin. avail mem={_gb(adm.budget.usable_bytes)} GB"


def sglang_load_end(adm: Admission, elapsed_s: float) -> str:
    """SGLang's weight-load end line."""
    b = adm.budget
    return (
        f"Load weight end. elapsed={elapsed_s:.2f} s, type={MODEL_CLASS}, avail mem="
        f"{_gb(b.usable_bytes - b.weights_bytes)} GB, mem usage={_gb(b.weights_bytes)} GB."
    )


def sglang_cache_lines(adm: Admission, model: ModelSpec) -> list[str]:
    """SGLang's state-pool and KV-pool allocation lines."""
    b, arch = adm.budget, model.architecture
    slots = b.state_pool_bytes // b.kda_state_bytes_per_slot if b.kda_state_bytes_per_slot else 0
    heads = arch.kda_num_heads // adm.shape.attn_tp
    ssm_per_slot = len(arch.kda_layers) * heads * arch.kda_head_dim**2 * DTYPE_BYTES[adm.ssm_dtype]
    ssm = slots * ssm_per_slot
    conv = slots * b.kda_state_bytes_per_slot - ssm
    mamba = (
        f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: {_gb(conv)}GB, "
        f"ssm_state size: {_gb(ssm)}GB"
    )
    kv = (
        f"KV Cache is allocated. dtype: {_TORCH_DTYPES.get(adm.kv_dtype, adm.kv_dtype)}, "
        f"#tokens: {b.kv_tokens}, "
        f"KV size: {_gb(b.kv_pool_bytes)} GB"
    )
    return [mamba, kv]


def sglang_summary_line(cfg: ServeConfig, adm: Admission) -> str:
    """SGLang's pool summary line."""
    b = adm.budget
    return (
        f"max_total_num_tokens={b.kv_tokens}, chunked_prefill_size="
        f"{cfg.chunked_prefill_size or SGLANG_DEFAULT_CHUNKED_PREFILL}, max_prefill_tokens="
        f"{cfg.max_prefill_tokens}, max_running_requests={adm.max_running_requests}, context_len="
        f"{adm.context_length}, available_gpu_mem={_gb(max(b.headroom_bytes, 0))} GB"
    )
