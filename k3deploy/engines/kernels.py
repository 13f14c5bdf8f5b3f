"""Which MoE and attention kernels K3 needs per accelerator; shared by the renderers and plan rules."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from k3deploy.catalog.specs import HardwareSpec
from k3deploy.engines.argv_opts import Opt, effective
from k3deploy.engines.flag_tables import FlagTable

# SGLang: K3 with --dcp-size > 1 runs only on these decode backends (Blackwell, AMD).
SGLANG_DCP_DECODE_BACKENDS = ("cutedsl_mla", "aiter")
SGLANG_MOE_DEFAULT = "auto"
# SGLang MoE runners that dequantize MXFP4 experts to BF16 in memory on SM90 (no FP4 tensor cores): the cookbook's
# "OOM at load because the MoE kernel fell back" (seed 000); `auto` picks that path silently.
SGLANG_HOPPER_UPCAST_MOE = frozenset({"auto", "triton"})
# vLLM --moe-backend choices that run MXFP4 experts as W4A16 on SM90 (the cookbook's Marlin path).
VLLM_HOPPER_W4A16_MOE = frozenset({"marlin"})


def sglang_kernel_opts(hw: HardwareSpec, dcp: int) -> tuple[Opt, ...]:
    """SGLang kernels: Hopper needs Marlin + FlashMLA; DCP needs cutedsl_mla/aiter; else defaults."""
    out: list[Opt] = []
    if hw.is_hopper:
        # `auto` on SM90 silently upcasts the MXFP4 experts to BF16 (no log line), then runs out of memory.
        out.append(Opt("--moe-runner-backend", ("marlin",)))
    decode: str | None = None
    if dcp > 1 and hw.is_blackwell:
        decode = "cutedsl_mla"
    elif dcp > 1 and hw.vendor == "amd":
        decode = "aiter"
    elif hw.is_hopper:
        decode = "flashmla"
    if decode is not None:
        out.append(Opt("--decode-attention-backend", (decode,)))
    return tuple(out)


def vllm_kernel_opts(hw: HardwareSpec) -> tuple[Opt, ...]:
    """vLLM kernels: Marlin MoE and FlashMLA attention on Hopper, engine defaults elsewhere."""
    if hw.is_hopper:
        return (Opt("--moe-backend", ("marlin",)), Opt("--attention-backend", ("FLASHMLA",)))
    return ()


@dataclass(frozen=True)
class SglangKernels:
    """The kernels SGLang will run with, after the user's engine.args (None: the engine picks)."""

    moe: str
    decode_attention: str | None


def sglang_effective_kernels(opts: Iterable[Opt], table: FlagTable) -> SglangKernels:
    """Resolve merged options as SGLang does: the decode backend falls back to --attention-backend."""
    opts = tuple(opts)
    moe = effective(opts, table, "moe_runner_backend")
    decode = effective(opts, table, "decode_attention_backend") or effective(opts, table, "attention_backend")
    return SglangKernels(moe=moe.values[0] if moe and moe.values else SGLANG_MOE_DEFAULT,
                         decode_attention=decode.values[0] if decode and decode.values else None)


@dataclass(frozen=True)
class KernelNeeds:
    """What K3 must run on an accelerator, as validate checks it in the engine's start-up log."""

    moe: str | None  # marlin | native_mxfp4 (see engines/data/log-lines.yaml moe_kinds); None: no rule
    attention: str | None  # the decode attention backend, lower case; None: the engine's choice
    reason: str
    graph: str | None = None  # the graph mode decode must run in (vLLM-Ascend's ACL graphs); None: no rule


def kernel_needs(hw: HardwareSpec, family: str, dcp: int = 1) -> KernelNeeds:
    """The same table the renderers use: Marlin W4A16 + FlashMLA on Hopper, native MXFP4 where FP4 cores exist."""
    opts = sglang_kernel_opts(hw, dcp) if family == "sglang" else vllm_kernel_opts(hw)
    named = {o.flag: o.values[0] for o in opts if o.values}
    attention = named.get("--decode-attention-backend") or named.get("--attention-backend")
    if hw.is_hopper:
        return KernelNeeds("marlin", attention and attention.lower(),
                           f"{hw.id} ({hw.arch}) has no FP4 tensor cores: K3's MXFP4 experts need Marlin W4A16")
    if hw.native_mxfp4:
        return KernelNeeds("native_mxfp4", attention and attention.lower(),
                           f"{hw.id} ({hw.arch}) runs MXFP4 natively: a Marlin or BF16 MoE kernel wastes it")
    if hw.vendor == "huawei":
        # The renderer's ASCEND_TUTORIAL_OPTS: decode in FULL_DECODE_ONLY ACL graphs (seed 004); eager decode pays
        # a host launch per kernel per step.
        return KernelNeeds(None, None, f"{hw.id} ({hw.arch}) decodes K3 in ACL graphs (FULL_DECODE_ONLY, as the "
                                       "vLLM-Ascend tutorial runs it); vLLM-Ascend logs its W4A8 MoE method only "
                                       "at debug level", graph="FULL_DECODE_ONLY")
    return KernelNeeds(None, attention and attention.lower(), f"no MoE kernel rule for {hw.id} ({hw.arch})")
