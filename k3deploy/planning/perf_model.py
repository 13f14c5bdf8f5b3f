"""The performance model of one replica, per GPU of its heaviest pipeline stage: a decode step and a prefill,
each explained term by term (as the memory budget is). Pure arithmetic over catalog figures:

- reads: non-expert weights / attention TP, the experts the step's tokens touch on this expert shard
  (each of E experts is hit by one of m tokens with probability 1 - (1 - k/E)^m), the running requests'
  MLA KV (context x bytes per token / DCP) and KDA state (moved kda_state_passes times), over HBM bandwidth
  x hbm_efficiency;
- compute: 2 FLOPs per weight per token (non-expert at the BF16 rate; routed experts at the FP4 rate where
  the accelerator runs MXFP4 natively, else upcast to BF16 as Marlin does) plus MLA attention, over the
  rate x compute_efficiency; a step takes the longer of reads and compute;
- collectives per layer: the attention-TP all-reduce, the MoE combine (all-reduce over TP, or all-to-all
  dispatch and combine when experts span DP ranks), DCP's gather per MLA layer, each latency + ring bytes /
  bandwidth on the scale-up fabric when the group fits one domain, else on the scale-out network;
- per-layer overhead (kernel launches, norms, routing): layer_overhead_us per layer, and in a decode step
  request_layer_us per running request of the attention group per layer (per-request kernel work the roofline
  above does not see; calibrated where published runs at two batches on one layout show it);
- expert parallelism: a rank holding whole experts reads and computes as the slowest EP rank does
  (planning/expert_balance: the expected maximum over ranks under uniform routing);
- expert tensor parallelism: without EP each GPU holds a 1/TP slice of every expert's intermediate size, which
  the family's MoE kernel pads up to moe_intermediate_align (SGLang's FlashInfer TRT-LLM MoE on Blackwell: 128);
  the padded rows are read and multiplied like real ones (K3 at TP16: 3072 / 16 = 192 -> 256, x 4/3).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from k3deploy.catalog.specs import EnginePerformance, HardwareSpec, ModelSpec
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.shape import Shape
from k3deploy.planning.expert_balance import slowest_rank_share, slowest_rank_tokens
from k3deploy.planning.memory import heaviest_stage, kda_state_bytes_per_slot, mla_kv_bytes_per_token
from k3deploy.planning.perf_band import Band

BF16 = 2


class PerfUnknown(ValueError):
    """The catalog lacks a figure the model needs (names the accelerator, the field and the fix)."""


class Term(NamedTuple):
    """One line of an explained duration."""

    name: str
    seconds: float
    how: str


class Step(NamedTuple):
    """A forward step of one pipeline stage: its terms and what bounds it."""

    reads_s: float
    compute_s: float
    collectives_s: float
    overhead_s: float
    terms: tuple[Term, ...]
    draft_s: float = 0.0  # the speculative draft's passes, before the verify forward (planning/draft_cost)

    @property
    def seconds(self) -> float:
        """Reads and compute overlap; collectives, overhead and the draft's passes do not."""
        return max(self.reads_s, self.compute_s) + self.collectives_s + self.overhead_s + self.draft_s

    @property
    def bound(self) -> str:
        """The largest of the five parts."""
        parts = {"HBM reads": self.reads_s, "compute": self.compute_s, "collectives": self.collectives_s,
                 "per-layer overhead": self.overhead_s, "the draft model": self.draft_s}
        return max(parts, key=lambda k: parts[k])


class PerfInputs(NamedTuple):
    """Everything the model reads."""

    model: ModelSpec
    hw: HardwareSpec
    shape: Shape
    perf: EnginePerformance
    family: EngineFamily
    kv_dtype: str
    ssm_dtype: str
    speed: float = 1.0
    drafts: int = 0  # speculative draft tokens per step: a step verifies drafts + 1 tokens per request
    accepted: float = 1.0  # tokens a (verify) step keeps per request
    draft_kv_bytes_per_token: float = 0.0  # the draft's KV per context token per GPU (engine catalog)
    band: Band | None = None  # how far the factors are known to hold on this accelerator (planning/perf_band)
    sockets: bool = False  # the collective library's RDMA transport is off: scale-out collectives run over TCP
    decode_scale: float = 1.0  # a cluster's own decode factor (planning/calibration): every decode time x this
    prefill_scale: float = 1.0  # ... and its prefill factor: every prefill time x this

    @property
    def attn_groups(self) -> int:
        """Independent attention groups in a replica (SGLang DP attention, vLLM DP ranks)."""
        s = self.shape
        if self.family == "vllm" or s.attention_dp:
            return max(s.dp, 1)
        return 1

    @property
    def experts_span_groups(self) -> bool:
        """Whether one MoE layer sees the tokens of every attention group."""
        return self.family == "sglang" or self.shape.ep > 1


def _stage(inp: PerfInputs) -> tuple[float, int, int, int]:
    """(layer fraction, layers, MLA layers, KDA layers) of the heaviest stage."""
    arch = inp.model.architecture
    st = heaviest_stage(arch, inp.shape.pp)
    return st.layer_fraction, round(st.layer_fraction * arch.num_hidden_layers), st.mla_layers, st.kda_layers


def link(inp: PerfInputs, group: int) -> tuple[float, float, str]:
    """(bytes/s, latency s, name) of the fabric a collective over `group` GPUs runs on. A group that leaves its
    node pays per ring step: on a multi-node scale-up domain (NVL72) scaleup_hop_latency_us for each of the
    2 (g - 1) steps of an all-reduce; over TCP sockets (RDMA off) socket_hop_latency_us for each of the 2 (n - 1)
    node-to-node steps."""
    hw, s = inp.hw, inp.shape
    inside = group <= max(s.gpus_per_node, hw.scaleup_domain_gpus or 1)
    bw, lat = ((hw.scaleup_gbps, hw.scaleup_latency_us) if inside else (hw.scaleout_gbps, hw.scaleout_latency_us))
    if bw is None or lat is None:
        fields = "scaleup_gbps and scaleup_latency_us" if inside else "scaleout_gbps and scaleout_latency_us"
        raise PerfUnknown(f"hardware {hw.id} has no {fields} in the catalog: a collective over {group} GPUs "
                          f"cannot be timed (add them with --catalog DIR, each with a source)")
    crosses = group > s.gpus_per_node
    if inside and crosses and hw.scaleup_hop_latency_us:
        lat += 2 * (group - 1) * hw.scaleup_hop_latency_us
    if not inside and inp.sockets:
        if hw.socket_hop_latency_us is None:
            raise PerfUnknown(f"hardware {hw.id} has no socket_hop_latency_us in the catalog: a collective over "
                              f"TCP sockets (RDMA disabled) cannot be timed")
        nodes = math.ceil(group / max(s.gpus_per_node, 1))
        lat = 2 * (nodes - 1) * hw.socket_hop_latency_us
        return bw * 1e9, lat * 1e-6, "scale-out over TCP sockets"
    return bw * 1e9, lat * 1e-6, "scale-up" if inside else "scale-out"


def allreduce_s(inp: PerfInputs, group: int, nbytes: float) -> float:
    """One ring all-reduce of `nbytes` over `group` GPUs: latency + 2 (g - 1) / g x bytes / bandwidth."""
    if group <= 1:
        return 0.0
    bw, lat, _ = link(inp, group)
    return lat + 2 * (group - 1) / group * nbytes / bw


def _alltoall_s(inp: PerfInputs, group: int, nbytes: float) -> float:
    bw, lat, _ = link(inp, group)
    return lat + (group - 1) / group * nbytes / bw


def collectives(inp: PerfInputs, attn_tokens: int, moe_tokens: int) -> tuple[float, str]:
    """Seconds of the stage's collectives for one forward of `attn_tokens` per attention group, and how."""
    if not inp.perf.collectives:
        return 0.0, "this engine runs no collectives per layer"
    s, arch = inp.shape, inp.model.architecture
    _frac, layers, mla, _kda = _stage(inp)
    hidden_bytes = arch.hidden_size * BF16
    attn = layers * allreduce_s(inp, s.attn_tp, attn_tokens * hidden_bytes)
    if inp.family == "vllm" and s.ep > 1 and s.dp > 1:
        group = s.tp * s.dp
        per = 2 * _alltoall_s(inp, group, attn_tokens * arch.num_experts_per_token * hidden_bytes)
        moe, moe_how = layers * per, f"MoE dispatch + combine all-to-all over {group}"
    else:
        moe = layers * allreduce_s(inp, s.tp, moe_tokens * hidden_bytes)
        moe_how = f"MoE all-reduce over TP {s.tp}"
    dcp = mla * allreduce_s(inp, s.dcp, attn_tokens * arch.num_attention_heads / s.attn_tp
                             * (arch.v_head_dim + 1) * 4) if s.dcp > 1 else 0.0
    groups = [g for g in (s.attn_tp, s.tp, s.dcp) if g > 1]
    where = ", ".join(sorted({link(inp, g)[2] for g in groups})) or "none"
    how = (f"{layers} layers x (attention all-reduce over {s.attn_tp} + {moe_how})"
           + (f" + {mla} DCP gathers" if s.dcp > 1 else "") + f" on {where}")
    return (attn + moe + dcp) / inp.speed, how


def rates(inp: PerfInputs) -> tuple[float, float]:
    """(non-expert, expert) FLOP/s after compute_efficiency."""
    hw, eff = inp.hw, inp.perf.compute_efficiency
    if hw.bf16_tflops is None:
        raise PerfUnknown(f"hardware {hw.id} has no bf16_tflops in the catalog: compute cannot be timed")
    expert = hw.fp4_tflops if hw.native_mxfp4 and hw.fp4_tflops else hw.bf16_tflops
    return hw.bf16_tflops * 1e12 * eff, expert * 1e12 * eff


def expert_padding(inp: PerfInputs) -> float:
    """How much larger each GPU's expert slices are as the MoE kernel holds them: its share of an expert's
    intermediate size (moe_intermediate_size / the TP degree the experts are sharded over) rounded up to the
    kernel's alignment, over the share itself (1 where it divides, or the family pads nothing)."""
    align, s = inp.perf.moe_intermediate_align, inp.shape
    moe_tp = max(1, s.expert_shards // max(s.ep, 1))
    size = inp.model.architecture.moe_intermediate_size
    if not align or not size or moe_tp <= 1:
        return 1.0
    share = size / moe_tp
    return math.ceil(share / align) * align / share


def _params(inp: PerfInputs) -> tuple[float, float]:
    """(non-expert params, active routed params per token) on one GPU of the heaviest stage."""
    m, s = inp.model, inp.shape
    frac = _stage(inp)[0]
    share = m.architecture.num_experts_per_token / m.architecture.num_experts
    experts = m.weights.routed_expert_bytes * 8 / m.weights.expert_bits_per_weight * share
    return m.weights.non_expert_bytes / BF16 / s.attn_tp * frac, experts / s.expert_shards * frac * expert_padding(inp)


def _attention_flops(inp: PerfInputs, context: float, *, decode: bool) -> float:
    """MLA FLOPs of one token attending to `context` tokens, on one GPU (absorbed form when decoding)."""
    a, s = inp.model.architecture, inp.shape
    mla = _stage(inp)[2]
    width = (2 * a.kv_lora_rank + a.qk_rope_head_dim) if decode else (a.qk_nope_head_dim + a.qk_rope_head_dim
                                                                     + a.v_head_dim)
    return 2 * a.num_attention_heads / s.attn_tp * context * width * mla / s.dcp


def decode_step(inp: PerfInputs, batch: int, context_tokens: float) -> Step:
    """One decode step of `batch` running requests (the whole replica) averaging `context_tokens` each."""
    m, s, hw, perf = inp.model, inp.shape, inp.hw, inp.perf
    frac, layers, mla, kda = _stage(inp)
    b = max(batch, 1)
    b_attn = math.ceil(b / inp.attn_groups)
    q = inp.drafts + 1  # tokens per request in one step (the verify window when speculating)
    m_moe = (b if inp.experts_span_groups else b_attn) * q
    arch = m.architecture
    touched = 1 - (1 - arch.num_experts_per_token / arch.num_experts) ** m_moe
    fixed = m.weights.non_expert_bytes / s.attn_tp * frac
    # With EP the slowest rank bounds the step: it holds whole experts and the tokens touch them unevenly.
    ep = s.ep if perf.ep_rank_imbalance else 1
    skew = slowest_rank_share(arch.num_experts, ep, touched)
    pad = expert_padding(inp)
    experts = m.weights.routed_expert_bytes / s.expert_shards * frac * touched * skew * pad
    kv = b_attn * context_tokens * mla_kv_bytes_per_token(arch, inp.kv_dtype, mla_layers=mla, dcp=s.dcp)
    state = b_attn * kda_state_bytes_per_slot(arch, s.attn_tp, inp.ssm_dtype, m.cache.conv_state_dtype,
                                              kda_layers=kda) * perf.kda_state_passes
    bw = hw.bandwidth_tbps * 1e12 * perf.hbm_efficiency * inp.speed
    reads = (fixed + experts + kv + state) / bw
    dense, routed = _params(inp)
    r_dense, r_expert = rates(inp)
    flops_dense = b_attn * q * (2 * dense + _attention_flops(inp, context_tokens, decode=True))
    token_skew = slowest_rank_tokens(m_moe * arch.num_experts_per_token, ep)
    compute = (flops_dense / r_dense + m_moe * 2 * routed * token_skew / r_expert) / inp.speed
    coll, coll_how = collectives(inp, b_attn * q, m_moe)
    per_request = perf.request_layer_us or 0.0
    overhead = layers * (perf.layer_overhead_us + b_attn * per_request) * 1e-6 / inp.speed
    gb = 1e9
    terms = (
        Term("HBM reads", reads, f"({fixed / gb:.2f} non-expert + {experts / gb:.2f} experts touched "
             f"({touched:.0%} of {arch.num_experts // max(s.ep, 1) if s.ep > 1 else arch.num_experts} at "
             f"{m_moe} tokens{f', slowest EP rank x {skew:.2f}' if ep > 1 else ''}"
             f"{f', slices padded x {pad:.2f}' if pad != 1 else ''}) + {kv / gb:.2f} MLA KV + {state / gb:.2f} KDA state) GB / "
             f"{hw.bandwidth_tbps:g} TB/s x {perf.hbm_efficiency:g}"),
        Term("compute", compute, f"{(flops_dense + m_moe * 2 * routed) / 1e12:.3f} TFLOP at "
             f"{'FP4' if r_expert != r_dense else 'BF16'} experts, x {perf.compute_efficiency:g} of peak"),
        Term("collectives", coll, coll_how),
        Term("per-layer overhead", overhead, f"{layers} layers x {perf.layer_overhead_us:g} us"
             + (f" + {b_attn} requests x {per_request:g} us a layer" if per_request else "")),
    )
    return Step(reads, compute, coll, overhead, terms)


def prefill(inp: PerfInputs, tokens: int, concurrent_groups: int = 1) -> Step:
    """One stage's pass over `tokens` uncached prompt tokens of one request, while `concurrent_groups`
    attention groups prefill alike (their expert work shares this GPU)."""
    m, s, hw, perf = inp.model, inp.shape, inp.hw, inp.perf
    frac, layers, _mla, _kda = _stage(inp)
    n = max(tokens, 1)
    dense, routed = _params(inp)
    r_dense, r_expert = rates(inp)
    g = concurrent_groups if inp.experts_span_groups else 1
    flops_dense = n * (2 * dense + _attention_flops(inp, n / 2, decode=False))
    flops_expert = g * n * 2 * routed
    compute = (flops_dense / r_dense + flops_expert / r_expert) / inp.speed
    weights = (m.weights.non_expert_bytes / s.attn_tp
               + m.weights.routed_expert_bytes / s.expert_shards * expert_padding(inp)) * frac
    reads = weights / (hw.bandwidth_tbps * 1e12 * perf.hbm_efficiency * inp.speed)
    coll, coll_how = collectives(inp, n, g * n)
    overhead = layers * perf.layer_overhead_us * 1e-6 / inp.speed
    terms = (
        Term("compute", compute, f"{n:,} tokens x {2 * (dense + g * routed) / 1e9:.1f} GFLOP/token + MLA "
             f"attention = {(flops_dense + flops_expert) / 1e12:.1f} TFLOP, x {perf.compute_efficiency:g} of peak"),
        Term("HBM reads", reads, f"the stage's weights once, {weights / 1e9:.1f} GB"),
        Term("collectives", coll, coll_how),
        Term("per-layer overhead", overhead, f"{layers} layers x {perf.layer_overhead_us:g} us"),
    )
    return Step(reads, compute, coll, overhead, terms)


def require_timeable(model: ModelSpec) -> None:
    """PerfUnknown unless the model is MLA + MoE, the only kind the terms here describe."""
    arch = model.architecture
    if arch.attention != "mla" or arch.num_experts < 1:
        # The terms are K3's: MLA's latent KV and routed experts (a dense GQA model divided by zero experts).
        raise PerfUnknown(f"model {model.id}: the performance model times MLA + MoE models like K3; this one "
                          f"is {arch.attention.upper()} with {arch.num_experts} routed experts")


def prefill_latency_s(inp: PerfInputs, tokens: int, concurrent_groups: int = 1) -> float:
    """Seconds from a `tokens`-token prompt's arrival to its first token, `concurrent_groups` attention groups
    prefilling alike: every pipeline stage in turn, plus the hand-offs between them."""
    require_timeable(inp.model)
    pp = inp.shape.pp
    return pp * prefill(inp, tokens, concurrent_groups).seconds + (pp - 1) * p2p_s(inp, tokens)


def engine_speed(env_name: str | None, env: dict[str, str]) -> float:
    """The engine's own speed factor (the stand-in's K3SIM_SPEED), 1 for real engines or when unset."""
    if env_name is None or env_name not in env:
        return 1.0
    try:
        speed = float(env[env_name])
    except ValueError:
        speed = 0.0
    if not speed > 0:
        raise PerfUnknown(f"engine.env {env_name}={env[env_name]!r}: expected a number > 0")
    return speed


def p2p_s(inp: PerfInputs, tokens: int) -> float:
    """One pipeline-stage hand-off of `tokens` hidden states (0 without PP or without collectives)."""
    s = inp.shape
    if s.pp <= 1 or not inp.perf.collectives:
        return 0.0
    stage_gpus = max(s.world_size // s.pp, 1)
    # A stage that fills its node hands off to another node; the pair then spans two stages' GPUs.
    bw, lat, _ = link(inp, 2 * stage_gpus if stage_gpus >= s.gpus_per_node else 2)
    return (lat + tokens * inp.model.architecture.hidden_size * BF16 / bw) / inp.speed
