"""kimi-k3-tiny: its config.json (K3 field names at toy sizes) and the K3 tensor layout of any such config."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

TINY_MODEL_NAME = "kimi-k3-tiny"
Dtype = Literal["U8", "BF16"]

DTYPE_BYTES: dict[str, int] = {"U8": 1, "BF16": 2}
PREFIX = "language_model.model."


def tiny_config() -> dict[str, Any]:
    """Return the config.json content of kimi-k3-tiny."""
    text_config: dict[str, Any] = {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "num_hidden_layers": 9,
        "first_k_dense_replace": 1,
        # 1-based like K3: blocks of 3 KDA + 1 MLA, closed by a final MLA layer.
        "linear_attn_config": {
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "full_attn_layers": [4, 8, 9],
            "num_heads": 8,
            "head_dim": 32,
            "short_conv_kernel_size": 4,
        },
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 64,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "vocab_size": 1024,
        "num_experts": 32,
        "num_experts_per_token": 4,
        "num_shared_experts": 2,
        "moe_intermediate_size": 64,
        "routed_expert_hidden_size": 128,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True,
        "routed_scaling_factor": 2.5,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 65536,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    return {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "_name_or_path": TINY_MODEL_NAME,
        "text_config": text_config,
        # K3 ships MoonViT-V2 here; the tiny model has no vision tower, so the field is explicitly absent.
        "vision_config": None,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "mxfp4-pack-quantized",
            "group_size": 32,
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32},
                }
            },
            # Only routed experts are MXFP4 (QAT); everything listed here stays BF16.
            "ignore": [
                "language_model.lm_head",
                "re:.*embed_tokens.*",
                "re:.*self_attn.*",
                "re:.*\\.mlp\\..*",
                "re:.*block_sparse_moe\\.gate$",
                "re:.*block_sparse_moe\\.latent_.*",
                "re:.*block_sparse_moe\\.shared_experts.*",
            ],
        },
    }


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the checkpoint: name, safetensors dtype and shape."""

    name: str
    dtype: Dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Payload size in bytes."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def is_routed_expert(self) -> bool:
        """True for MXFP4 routed-expert tensors (packed weights and their scales)."""
        return ".block_sparse_moe.experts." in self.name


def _bf16(name: str, *shape: int) -> TensorSpec:
    return TensorSpec(name, "BF16", tuple(shape))


def _mxfp4(name: str, out_dim: int, in_dim: int, group: int) -> list[TensorSpec]:
    # Two E2M1 values per byte, one E8M0 scale per `group` weights along the input dim.
    return [
        TensorSpec(f"{name}.weight_packed", "U8", (out_dim, in_dim // 2)),
        TensorSpec(f"{name}.weight_scale", "U8", (out_dim, in_dim // group)),
    ]


def _kda_specs(p: str, t: dict[str, Any]) -> list[TensorSpec]:
    hidden, lin = t["hidden_size"], t["linear_attn_config"]
    heads, head_dim, kernel = lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
    proj = heads * head_dim
    specs = [_bf16(f"{p}.{x}_proj.weight", proj, hidden) for x in ("q", "k", "v")]
    specs += [_bf16(f"{p}.{x}_conv1d.weight", proj, 1, kernel) for x in ("q", "k", "v")]
    specs += [
        _bf16(f"{p}.A_log", 1, 1, heads, 1),
        _bf16(f"{p}.dt_bias", proj),
        _bf16(f"{p}.f_a_proj.weight", head_dim, hidden),
        _bf16(f"{p}.f_b_proj.weight", proj, head_dim),
        _bf16(f"{p}.b_proj.weight", heads, hidden),
        _bf16(f"{p}.g_a_proj.weight", head_dim, hidden),
        _bf16(f"{p}.g_b_proj.weight", proj, head_dim),
        _bf16(f"{p}.o_norm.weight", head_dim),
        _bf16(f"{p}.o_proj.weight", hidden, proj),
    ]
    return specs


def _mla_specs(p: str, t: dict[str, Any]) -> list[TensorSpec]:
    hidden, heads = t["hidden_size"], t["num_attention_heads"]
    q_rank, kv_rank, rope = t["q_lora_rank"], t["kv_lora_rank"], t["qk_rope_head_dim"]
    nope, v_dim = t["qk_nope_head_dim"], t["v_head_dim"]
    specs = [
        _bf16(f"{p}.q_a_proj.weight", q_rank, hidden),
        _bf16(f"{p}.q_a_layernorm.weight", q_rank),
        _bf16(f"{p}.q_b_proj.weight", heads * (nope + rope), q_rank),
        _bf16(f"{p}.kv_a_proj_with_mqa.weight", kv_rank + rope, hidden),
        _bf16(f"{p}.kv_a_layernorm.weight", kv_rank),
        _bf16(f"{p}.kv_b_proj.weight", heads * (nope + v_dim), kv_rank),
        _bf16(f"{p}.o_proj.weight", hidden, heads * v_dim),
    ]
    if t.get("mla_use_output_gate"):
        specs.append(_bf16(f"{p}.o_gate_proj.weight", heads * v_dim, hidden))
    return specs


def _moe_specs(p: str, t: dict[str, Any], group: int) -> list[TensorSpec]:
    hidden, experts = t["hidden_size"], t["num_experts"]
    inter, latent = t["moe_intermediate_size"], t["routed_expert_hidden_size"]
    shared = inter * t["num_shared_experts"]
    specs = [
        _bf16(f"{p}.gate.weight", experts, hidden),
        _bf16(f"{p}.gate.e_score_correction_bias", experts),
        # Latent MoE: routed experts run in routed_expert_hidden_size, shared experts in hidden_size.
        _bf16(f"{p}.latent_down_proj.weight", latent, hidden),
        _bf16(f"{p}.latent_up_proj.weight", hidden, latent),
        _bf16(f"{p}.shared_experts.gate_proj.weight", shared, hidden),
        _bf16(f"{p}.shared_experts.up_proj.weight", shared, hidden),
        _bf16(f"{p}.shared_experts.down_proj.weight", hidden, shared),
    ]
    for e in range(experts):
        specs += _mxfp4(f"{p}.experts.{e}.w1", inter, latent, group)
        specs += _mxfp4(f"{p}.experts.{e}.w2", latent, inter, group)
        specs += _mxfp4(f"{p}.experts.{e}.w3", inter, latent, group)
    return specs


def tensor_specs(config: dict[str, Any]) -> list[TensorSpec]:
    """List every tensor of a K3-shaped checkpoint, in file order, derived from config.json content."""
    t = config["text_config"]
    hidden, vocab, lin = t["hidden_size"], t["vocab_size"], t["linear_attn_config"]
    kda, mla = set(lin["kda_layers"]), set(lin["full_attn_layers"])
    specs = [_bf16(f"{PREFIX}embed_tokens.weight", vocab, hidden)]
    for layer in range(t["num_hidden_layers"]):
        p = f"{PREFIX}layers.{layer}"
        specs += [_bf16(f"{p}.input_layernorm.weight", hidden)]
        specs += [_bf16(f"{p}.post_attention_layernorm.weight", hidden)]
        # The layer lists are 1-based in K3's config.
        if layer + 1 in kda:
            specs += _kda_specs(f"{p}.self_attn", t)
        elif layer + 1 in mla:
            specs += _mla_specs(f"{p}.self_attn", t)
        else:
            raise ValueError(f"layer {layer + 1} (1-based) is in neither kda_layers nor full_attn_layers")
        if layer < t["first_k_dense_replace"]:
            inter = t["intermediate_size"]
            specs += [_bf16(f"{p}.mlp.{x}_proj.weight", inter, hidden) for x in ("gate", "up")]
            specs += [_bf16(f"{p}.mlp.down_proj.weight", hidden, inter)]
        else:
            specs += _moe_specs(f"{p}.block_sparse_moe", t, config["quantization_config"]["group_size"])
    specs += [_bf16(f"{PREFIX}norm.weight", hidden), _bf16("language_model.lm_head.weight", vocab, hidden)]
    return specs


def payload_bytes(config: dict[str, Any]) -> dict[str, int]:
    """Return tensor payload bytes: total, routed_experts (MXFP4) and non_expert (BF16)."""
    specs = tensor_specs(config)
    routed = sum(s.nbytes for s in specs if s.is_routed_expert)
    total = sum(s.nbytes for s in specs)
    return {"total": total, "routed_experts": routed, "non_expert": total - routed}
