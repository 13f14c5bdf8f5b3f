"""Frozen catalog specs: models, accelerators, engine memory defaults; every number has a source."""
# No `from __future__ import annotations` here (as in topology/): pydantic would compile every annotation
# string when the classes are created, on the start-up path of every command (half this module's import).
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 1 << 30

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class Spec(BaseModel):
    """Strict, immutable base for catalog entries."""

    # Built on first validation: a run that takes the validated catalog from the cache never validates.
    # No number is infinite or NaN: 1e999 reads as inf, and inf passes every `ge`/`gt` bound.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False)


class Sourced(Spec):
    """A spec whose numeric fields must each name a source."""

    sources: dict[str, str] = Field(description="field name -> where the number comes from")

    @model_validator(mode="after")
    def _every_number_sourced(self) -> "Sourced":
        missing = [
            name
            for name, value in self
            if name != "sources" and _is_number(value) and name not in self.sources
        ]
        if missing:
            raise ValueError(f"no source for: {', '.join(missing)}")
        return self


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_number(v) for v in value)


class Architecture(Sourced):
    """The config.json facts the planner and renderer need."""

    model_type: str
    text_model_type: str
    num_hidden_layers: int
    first_k_dense_replace: int
    kda_layers: tuple[int, ...] = Field(description="1-based KDA layer numbers")
    full_attn_layers: tuple[int, ...] = Field(description="1-based Gated MLA layer numbers")
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    vocab_size: int
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    routed_expert_hidden_size: int
    max_position_embeddings: int
    attention: Literal["mla", "gqa"] = Field(
        "mla", description="how full-attention layers cache a token: MLA's one latent (kv_lora_rank + "
        "qk_rope_head_dim), or GQA's K and V per KV head (num_key_value_heads x head_dim)")
    head_dim: int | None = Field(None, description="GQA: the size of one attention head (needed for gqa)")
    config_keys: dict[str, str | None] = Field(
        default_factory=dict, description="field -> its dotted key in config.json where it differs from "
        "K3's layout (text_config.<field>); null: config.json has no such key (the shards stage skips it)")

    @model_validator(mode="after")
    def _layout_consistent(self) -> "Architecture":
        layers = sorted(self.kda_layers + self.full_attn_layers)
        if layers != list(range(1, self.num_hidden_layers + 1)):
            raise ValueError("kda_layers and full_attn_layers must partition 1..num_hidden_layers")
        if self.attention == "gqa" and self.head_dim is None:
            raise ValueError("attention gqa needs head_dim")
        unknown = sorted(set(self.config_keys) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"config_keys names no architecture field: {', '.join(unknown)}")
        return self

    def config_fields(self) -> dict[str, Any]:
        """The fields that describe config.json (not how we read it), as plain values."""
        return self.model_dump(exclude={"sources", "attention", "head_dim", "config_keys"})

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (all but the first dense ones)."""
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def routed_expert_elems(self) -> int:
        """Weights in all routed experts (gate, up, down per expert per MoE layer)."""
        per_expert = 3 * self.moe_intermediate_size * self.routed_expert_hidden_size
        return self.moe_layers * self.num_experts * per_expert


class Weights(Sourced):
    """Checkpoint payload sizes."""

    expert_format: Literal["mxfp4", "w4a8", "bf16"]
    expert_bits_per_weight: float
    total_bytes: int
    routed_expert_bytes: int
    shard_count: int

    @property
    def non_expert_bytes(self) -> int:
        """Everything that is not a routed expert (BF16 attention, shared experts, embeddings)."""
        return self.total_bytes - self.routed_expert_bytes


class CacheDtypes(Sourced):
    """Default dtypes of the MLA KV cache and the KDA recurrent state."""

    kv_cache_dtype: Literal["bf16", "fp8"]
    ssm_state_dtype: Literal["fp32", "bf16"]
    conv_state_dtype: Literal["bf16", "fp32"]


class DraftSpec(Sourced):
    """The speculative draft model a checkpoint is served with (DSpark): what one drafting pass reads and
    computes on top of the target's verify step."""

    hub_repo: str
    weights_bytes: int = Field(description="the draft's own weights (BF16), not counting the LM head it shares")
    num_layers: int = Field(description="decoder layers of the draft (dense MLA)")
    passes_per_step: int = Field(description="draft forward passes per verify step (DSpark: the whole block "
                                 "in one parallel pass)")
    shares_lm_head: bool = Field(description="the draft projects its drafted positions through the target's "
                                 "LM head (read again per step)")


class ChatParsers(Spec):
    """The engines' chat plug-ins a model's own format needs (registry names); none: the engine's defaults."""

    tokenizer_mode: str | None = Field(None, description="vLLM --tokenizer-mode (SGLang has no such flag)")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser: splits thinking from the answer")
    tool_call_parser: str | None = Field(None, description="--tool-call-parser: reads tool calls from the text")


class ModelSpec(Sourced):
    """A model checkpoint the planner can size."""

    id: str
    name: str
    hub_repo: str
    architecture: Architecture
    weights: Weights
    cache: CacheDtypes
    quantization: str | None = Field(None, description="engine --quantization value the checkpoint needs")
    parsers: ChatParsers = Field(default_factory=ChatParsers, description="the tokenizer mode and parsers the "
                                 "engines need for this model's chat format (none given: no such flag)")
    draft_acceptance_length: dict[int, float] = Field(
        default_factory=dict, description="speculative decoding (DSpark draft): mean tokens a verify step keeps, "
        "by draft tokens proposed per step")
    draft: DraftSpec | None = Field(None, description="the draft model whose cost speculative decoding adds")
    sglang_static_overhead_gib: float | None = Field(
        None, description="GiB per GPU SGLang holds inside its static share beside this model's weights when it "
        "sizes its KV and state pools (none given: 0)")


class HardwareSpec(Sourced):
    """One accelerator model."""

    id: str
    name: str
    vendor: Literal["nvidia", "amd", "huawei", "sim", "cpu"]
    arch: str
    memory_gib: float
    usable_gib: float
    bandwidth_tbps: float
    bf16_tflops: float | None = Field(None, description="dense BF16 tensor throughput, TFLOP/s (prefill pacing)")
    native_mxfp4: bool
    typical_gpus_per_node: int
    runtime_reserve_gib: float | None = None
    fp4_tflops: float | None = Field(None, description="dense FP4 (MXFP4) tensor throughput, TFLOP/s; none: FP4 "
                                     "weights are upcast and run at the BF16 rate (Marlin on Hopper)")
    scaleup_domain_gpus: int | None = Field(None, description="GPUs one scale-up fabric joins (NVLink domain): "
                                            "collectives inside it use scaleup_gbps")
    scaleup_gbps: float | None = Field(None, description="scale-up bandwidth per GPU, one direction, GB/s")
    scaleup_latency_us: float | None = Field(None, description="latency of one small collective inside the "
                                             "scale-up domain, microseconds")
    scaleout_gbps: float | None = Field(None, description="scale-out (network) bandwidth per GPU, one direction, "
                                        "GB/s")
    scaleout_latency_us: float | None = Field(None, description="latency of one small collective across nodes "
                                              "over the scale-out network, microseconds")

    @property
    def usable_bytes(self) -> int:
        """Usable memory per accelerator in bytes."""
        return round(self.usable_gib * GIB)

    @property
    def is_hopper(self) -> bool:
        """SM90: no FP4 tensor cores, K3 experts need Marlin."""
        return self.arch == "sm90"

    @property
    def is_blackwell(self) -> bool:
        """SM100/SM103: native MXFP4 kernels."""
        return self.arch.startswith("sm10")


class VendorSpec(Spec):
    """Collective library and the env names that pick its interface."""

    collective: str
    socket_ifname_env: tuple[str, ...]
    visible_devices_env: str | None
    alloc_conf_env: str | None
    host_ip_env: str | None = None


class ReplayRing(Sourced):
    """SGLang ReplaySSM for speculative verify (`--enable-linear-replayssm-spec`): no verify-intermediate
    KDA states; each state slot carries a ring of `ring_len` records of the step's inputs instead."""

    flag: str = Field(description="the engine flag that turns it on")
    len_flag: str = Field(description="the engine flag that sets the ring length")
    ring_len: int = Field(ge=1, description="records per slot when the length flag is unset")
    conv_vectors: int = Field(ge=0, description="head_dim vectors per KDA head per record in the conv-state dtype")
    fp32_vectors: int = Field(ge=0, description="head_dim vectors per KDA head per record in FP32")
    fp32_scalars: int = Field(ge=0, description="scalars per KDA head per record in FP32")


class EngineDefaults(Sourced):
    """Memory-model defaults of one engine."""

    version: str
    default_mem_fraction: float
    slots_per_request: dict[str, int]
    mamba_full_memory_ratio_default: float | None = None
    avg_request_tokens: int | None = None
    draft_kv_bytes_per_token: int | None = None
    speculative_extra_slots: int | None = None
    block_multiple_tokens: int | None = None
    replay_ring: ReplayRing | None = None


class EnginePerformance(Sourced):
    """How one engine kind turns the accelerator's figures into decode steps and prefills (the performance
    model's efficiency factors; each calibrated once or documented, never fitted per case)."""

    hbm_efficiency: float = Field(gt=0, le=1, description="share of peak HBM bandwidth a decode step's reads reach")
    compute_efficiency: float = Field(gt=0, le=1, description="share of peak tensor throughput a forward step "
                                      "reaches (calibrated on prefill, where compute binds)")
    layer_overhead_us: float = Field(ge=0, description="time per layer per forward step beyond its reads, "
                                     "compute and collectives (kernel launches, norms, routing), microseconds")
    collectives: bool = Field(description="whether the engine runs the TP/EP/DCP collectives of each layer")
    prefill_stalls_decode: bool = Field(description="whether a prefill holds up the running batch's decode "
                                        "steps (SGLang, vLLM) or runs beside them (the stand-in)")
    kda_state_passes: int = Field(ge=1, description="times a decode step moves each request's KDA state "
                                  "through HBM (2: read and written back)")
    speed_env: str | None = Field(None, description="engine.env variable that scales every duration (the "
                                  "stand-in's K3SIM_SPEED); none for real engines")
    acceptance_env: str | None = Field(None, description="engine.env variable that pins the tokens a speculative "
                                       "verify step keeps (benchmark runs); none: the model's catalog figure")
    ep_rank_imbalance: bool = Field(True, description="whether a step waits for the EP rank whose whole "
                                    "experts the step's tokens touch most (real routing), or paces the mean rank "
                                    "(the stand-in)")


class PlannerDefaults(Sourced):
    """Planner-wide defaults."""

    runtime_reserve_gib: float
    router_health_margin: float = Field(gt=1, description="the router's health-check timeout is this many times "
                                        "the predicted prefill of the longest prompt the plan allows")


class Catalog(Spec):
    """Everything the catalog knows, by id."""

    models: dict[str, ModelSpec]
    hardware: dict[str, HardwareSpec]
    vendors: dict[str, VendorSpec]
    engines: dict[str, EngineDefaults]
    planner: PlannerDefaults
    performance: dict[str, EnginePerformance] = Field(default_factory=dict, description="engine kind -> its "
                                                      "performance-model factors")

    def model(self, model_id: str) -> ModelSpec:
        """Look up a model by id."""
        return self.models[model_id]

    def gpu(self, hardware_id: str) -> HardwareSpec:
        """Look up an accelerator by id."""
        return self.hardware[hardware_id]

    def vendor(self, hardware_id: str) -> VendorSpec:
        """Collective facts for an accelerator."""
        return self.vendors[self.hardware[hardware_id].vendor]
