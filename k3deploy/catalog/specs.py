"""Frozen catalog specs: models (architecture, weights, cache dtypes, draft, chat parsers) and the catalog
itself; what they run on is in platform_specs, the base in spec_base. Every number has a source."""
# No `from __future__ import annotations` here (as in topology/): pydantic would compile every annotation
# string when the classes are created, on the start-up path of every command (half this module's import).
from typing import Any, Literal

from pydantic import Field, model_validator

from k3deploy.catalog.platform_specs import (
    EngineDefaults,
    EnginePerformance,
    FamilyPerformance,
    HardwareSpec,
    PlannerDefaults,
    ReplayRing,
    VendorSpec,
)
from k3deploy.catalog.spec_base import DTYPE_BYTES, GIB, Sourced, Spec

__all__ = ["DTYPE_BYTES", "GIB", "AccuracyReference", "Architecture", "CacheDtypes", "Catalog", "ChatParsers", "DraftSpec",
           "EngineDefaults", "EnginePerformance", "FamilyPerformance", "HardwareSpec", "ModelSpec", "PlannerDefaults", "ReplayRing",
           "Sourced", "Spec", "VendorSpec", "VisionSpec", "Weights"]


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
    full_attn_position: Literal["rope", "nope"] = Field(
        "rope", description="positional encoding of the full-attention layers: nope, none (a RoPE/YaRN override "
        "does not apply, plan refuses one)")
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
        return self.model_dump(exclude={"sources", "attention", "head_dim", "config_keys", "full_attn_position"})

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
    passes_per_step: int | None = Field(description="draft forward passes per verify step (DSpark: the whole "
                                        "block in one parallel pass; none: one per drafted token, EAGLE-3's "
                                        "autoregressive drafting)")
    shares_lm_head: bool = Field(description="the draft projects its drafted positions through the target's "
                                 "LM head (read again per step)")
    kv_bytes_per_token: float | None = Field(None, description="the draft's KV per token (none given: the engine's "
                                             "draft_kv_bytes_per_token, DSpark's)")


class DraftCheckpoint(Spec):
    """A published draft checkpoint for a model: what the engine must be told to run it."""

    hub_repo: str = Field(description="the checkpoint's hub name; a speculative flag's draft path ending in its "
                          "last part names it")
    method: Literal["dspark", "eagle3"] = Field(description="the speculative method it is trained for")
    num_speculative_tokens: int = Field(description="draft tokens per step its checkpoint is trained for "
                                        "(vLLM num_speculative_tokens, SGLang --speculative-dspark-block-size)")
    source: str = Field(description="where the pairing is documented")


class ChatParsers(Spec):
    """The engines' chat plug-ins a model's own format needs (registry names); none: the engine's defaults."""

    tokenizer_mode: str | None = Field(None, description="vLLM --tokenizer-mode (SGLang has no such flag)")
    reasoning_parser: str | None = Field(None, description="--reasoning-parser: splits thinking from the answer")
    tool_call_parser: str | None = Field(None, description="--tool-call-parser: reads tool calls from the text")


class VisionSpec(Sourced):
    """The vision encoder and its image processor: what an image costs in weights and in context tokens."""

    encoder: str = Field(description="the encoder's name (MoonViT-V2)")
    params: int = Field(description="the tower's and projector's parameters (0: the checkpoint has no tower)")
    num_layers: int = Field(description="encoder layers")
    num_heads: int = Field(description="encoder attention heads (vLLM shards the tower over TP only when TP "
                           "divides them)")
    dtype: Literal["bf16"] = Field("bf16", description="the tower's weight dtype (quantized checkpoints keep it "
                                   "BF16)")
    patch_size: int = Field(description="pixels per patch side")
    merge_kernel_size: int = Field(description="patches per side merged into one token (pixel shuffle)")
    in_patch_limit: int = Field(description="most patches an image keeps before it is scaled down")
    patch_limit_on_one_side: int = Field(description="most patches along one side")
    wrapper_tokens_max: int = Field(description="most prompt tokens around an image's pads (its begin, size "
                                    "text, content and end markers, less the placeholder they replace)")
    max_image_tokens: int = Field(description="the most tokens one image costs under the processor rules above "
                                  "(the feature size vLLM profiles the encoder with)")


class AccuracyReference(Sourced):
    """The score a model should reach on an accuracy task, for the `accuracy` stage to compare against."""

    score: float = Field(ge=0, le=1, description="the reference exact-match score (0..1)")
    tolerance: float = Field(ge=0, le=1, description="how far below the reference a deployment may score")
    dataset_sha256: str | None = Field(None, description="the dataset file's sha256 the score is for (its pinned "
                                       "revision; none: any file)")
    lm_eval_task: str | None = Field(None, description="the lm-eval task the score was published for, whose questions "
                                     "the dataset file must hold (none: k3deploy's own task)")


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
    eagle3_draft: DraftSpec | None = Field(None, description="the EAGLE-3 draft (the technical report's MTP layer "
                                           "as an EAGLE-3 head) whose memory speculative decoding adds")
    draft_checkpoints: tuple[DraftCheckpoint, ...] = Field((), description="published drafts for this model, each "
                                                           "with the token count its checkpoint expects")
    vision: VisionSpec | None = Field(None, description="the vision encoder (none: a text-only model)")
    accuracy_references: dict[str, AccuracyReference] = Field(
        default_factory=dict, description="accuracy task name -> the score the model should reach on it")
    served_model_name: str | None = Field(
        None, description="the name clients call the model by (--served-model-name; none given: the model id)")
    load_dist_timeout_s: int | None = Field(
        None, description="the distributed-init timeout a multi-node load of this checkpoint needs (plan warns "
        "below it; none given: no rule)")
    sglang_static_overhead_gib: float | None = Field(
        None, description="GiB per GPU SGLang holds beside this model's weights and its KV and state pools when it "
        "sizes the pools (none given: 0)")
    sglang_preload_overhead_gib: float | None = Field(
        None, description="the part of sglang_static_overhead_gib already resident before the weights load (CUDA "
        "context, communicators): SGLang takes its (1 - mem_fraction_static) share from what is free then, so "
        "this part is outside that share (none given: 0)")


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
