"""Tiny real checkpoints the real vLLM serves on CPU, written here with random BF16 weights (no download):
a dense Llama and an MLA+MoE DeepseekV3 (the Kimi K2 shape) within the CPU kernels' limits. Each directory
has config.json, a real tokenizer, safetensors (one `model.safetensors`, or shards with an index) and a
sha256 manifest. The catalog entries describing them are tests/assets/catalog/*.yaml."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from k3deploy.checkpoint.manifest import CONFIG_FILE, INDEX_FILE, MANIFEST_FILE, create_manifest
from k3deploy.sim.checkpoint import TensorSpec, shard_name, shard_ranges, tensor_bytes, write_safetensors
from tests.realengine.tokenizer import special_ids, write_tokenizer

CATALOG_DIR = Path(__file__).resolve().parent.parent / "assets" / "catalog"
LLAMA_ID = "tiny-llama"  # catalog ids (tests/assets/catalog/): vLLM serves the model under this name
DEEPSEEK_ID = "tiny-deepseek-v3"
VOCAB = 512
MAX_POSITIONS = 4096
SINGLE_FILE = "model.safetensors"


def llama_config(head_dim: int = 32) -> dict[str, Any]:
    """config.json of the dense Llama: hidden 128, 2 layers, 4 heads, 2 KV heads, vocab 512.
    vLLM's CPU attention takes head_dim 32 (16 reaches /health 200, then dies on the first request)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": head_dim, "vocab_size": VOCAB, "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def deepseek_config() -> dict[str, Any]:
    """config.json of the MLA+MoE DeepseekV3: the CPU MLA kernel takes a latent of 576 only (kv_lora_rank
    512 + qk_rope_head_dim 64); 8 routed experts, top-2, 1 shared; layer 0 dense, layer 1 MoE."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 128,
            "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "norm_topk_prob": True, "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 0,
            "vocab_size": VOCAB, "hidden_act": "silu", "max_position_embeddings": MAX_POSITIONS,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _mlp(prefix: str, hidden: int, inter: int) -> list[TensorSpec]:
    return [TensorSpec(f"{prefix}.gate_proj.weight", "BF16", (inter, hidden)),
            TensorSpec(f"{prefix}.up_proj.weight", "BF16", (inter, hidden)),
            TensorSpec(f"{prefix}.down_proj.weight", "BF16", (hidden, inter))]


def _ends(c: dict[str, Any], layers: list[TensorSpec]) -> list[TensorSpec]:
    h, v = c["hidden_size"], c["vocab_size"]
    return [TensorSpec("model.embed_tokens.weight", "BF16", (v, h)), *layers,
            TensorSpec("model.norm.weight", "BF16", (h,)), TensorSpec("lm_head.weight", "BF16", (v, h))]


def llama_tensors(c: dict[str, Any]) -> list[TensorSpec]:
    """Every tensor of the Llama config, by the hub's names."""
    h, d, heads, kv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    out: list[TensorSpec] = []
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [TensorSpec(f"{p}.input_layernorm.weight", "BF16", (h,)),
                TensorSpec(f"{p}.self_attn.q_proj.weight", "BF16", (heads * d, h)),
                TensorSpec(f"{p}.self_attn.k_proj.weight", "BF16", (kv * d, h)),
                TensorSpec(f"{p}.self_attn.v_proj.weight", "BF16", (kv * d, h)),
                TensorSpec(f"{p}.self_attn.o_proj.weight", "BF16", (h, heads * d)),
                TensorSpec(f"{p}.post_attention_layernorm.weight", "BF16", (h,)),
                *_mlp(f"{p}.mlp", h, c["intermediate_size"])]
    return _ends(c, out)


def deepseek_tensors(c: dict[str, Any]) -> list[TensorSpec]:
    """Every tensor of the DeepseekV3 config, by the hub's names (MLA with a q LoRA, shared + routed experts)."""
    h, heads, q_lora, kv_lora = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, v, experts = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["n_routed_experts"]
    out: list[TensorSpec] = []
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [TensorSpec(f"{p}.input_layernorm.weight", "BF16", (h,)),
                TensorSpec(f"{p}.self_attn.q_a_proj.weight", "BF16", (q_lora, h)),
                TensorSpec(f"{p}.self_attn.q_a_layernorm.weight", "BF16", (q_lora,)),
                TensorSpec(f"{p}.self_attn.q_b_proj.weight", "BF16", (heads * (nope + rope), q_lora)),
                TensorSpec(f"{p}.self_attn.kv_a_proj_with_mqa.weight", "BF16", (kv_lora + rope, h)),
                TensorSpec(f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (kv_lora,)),
                TensorSpec(f"{p}.self_attn.kv_b_proj.weight", "BF16", (heads * (nope + v), kv_lora)),
                TensorSpec(f"{p}.self_attn.o_proj.weight", "BF16", (h, heads * v)),
                TensorSpec(f"{p}.post_attention_layernorm.weight", "BF16", (h,))]
        if i < c["first_k_dense_replace"]:
            out += _mlp(f"{p}.mlp", h, c["intermediate_size"])
            continue
        inter = c["moe_intermediate_size"]
        out += [TensorSpec(f"{p}.mlp.gate.weight", "BF16", (experts, h)),
                TensorSpec(f"{p}.mlp.gate.e_score_correction_bias", "BF16", (experts,))]
        for e in range(experts):
            out += _mlp(f"{p}.mlp.experts.{e}", h, inter)
        out += _mlp(f"{p}.mlp.shared_experts", h, inter * c["n_shared_experts"])
    return _ends(c, out)


def write_real_checkpoint(directory: Path | str, config: dict[str, Any], specs: list[TensorSpec], *,
                          shards: int = 1, seed: int = 0) -> Path:
    """Write config, tokenizer, safetensors and a sha256 manifest; shards=1 is the single-file form (one
    model.safetensors, no index), as small hub models ship."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, config["vocab_size"], config["max_position_embeddings"])
    config = {**config, **{f"{k}_token_id": i for k, i in special_ids(out).items()}}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}".encode()).digest()[:8], "big"))
    weight_map: dict[str, str] = {}
    for k, idx in enumerate(shard_ranges(specs, shards)):
        name = SINGLE_FILE if shards == 1 else shard_name(k, shards)
        part = [specs[i] for i in idx]
        write_safetensors(out / name, part, [tensor_bytes(s, rng) for s in part])
        weight_map.update({s.name: name for s in part})
    if shards > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    manifest = create_manifest(out, revision=f"seed-{seed}", threads=1)
    (out / MANIFEST_FILE).write_text(manifest.model_copy(update={"source": f"tests.realengine seed {seed}"}).dump())
    return out


def write_llama(directory: Path | str, *, head_dim: int = 32, shards: int = 1, seed: int = 0) -> Path:
    """The dense Llama checkpoint (catalog id tiny-llama; head_dim 16 gives the model that dies on its first
    request)."""
    config = llama_config(head_dim)
    return write_real_checkpoint(directory, config, llama_tensors(config), shards=shards, seed=seed)


def write_deepseek(directory: Path | str, *, shards: int = 1, seed: int = 0) -> Path:
    """The MLA+MoE DeepseekV3 checkpoint (catalog id tiny-deepseek-v3)."""
    config = deepseek_config()
    return write_real_checkpoint(directory, config, deepseek_tensors(config), shards=shards, seed=seed)
