"""The served model's identity and sizes from MODEL_PATH/config.json, and the node's pretend accelerator."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import Architecture, CacheDtypes, HardwareSpec, ModelSpec, Weights

GPU_ENV = "K3SIM_GPU"
DEFAULT_GPU = "sim"
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
# The model classes this stand-in can serve (what `k3deploy preflight` asks an engine for).
SUPPORTED_ARCHITECTURES = ("KimiK3ForConditionalGeneration",)
_SOURCE = "k3deploy.sim: read from config.json"
# Architecture field -> key inside text_config (or inside its linear_attn_config when prefixed "lin.").
_FIELDS = {
    "num_hidden_layers": "num_hidden_layers",
    "first_k_dense_replace": "first_k_dense_replace",
    "kda_layers": "lin.kda_layers",
    "full_attn_layers": "lin.full_attn_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "kda_num_heads": "lin.num_heads",
    "kda_head_dim": "lin.head_dim",
    "short_conv_kernel_size": "lin.short_conv_kernel_size",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "v_head_dim": "v_head_dim",
    "vocab_size": "vocab_size",
    "num_experts": "num_experts",
    "num_experts_per_token": "num_experts_per_token",
    "num_shared_experts": "num_shared_experts",
    "moe_intermediate_size": "moe_intermediate_size",
    "routed_expert_hidden_size": "routed_expert_hidden_size",
    "max_position_embeddings": "max_position_embeddings",
}


class ModelError(Exception):
    """The checkpoint directory or the declared accelerator cannot be used."""


def read_config(model_path: str | Path) -> dict[str, Any]:
    """Parsed MODEL_PATH/config.json."""
    path = Path(model_path) / CONFIG_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelError(
            f"OSError: {model_path} does not appear to have a file named {CONFIG_FILE}."
        ) from exc
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    return data


def architecture_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The catalog Architecture fields found in a K3-style config.json."""
    text = config.get("text_config") or config
    lin = text.get("linear_attn_config") or {}
    out: dict[str, Any] = {"model_type": config.get("model_type"), "text_model_type": text.get("model_type")}
    for name, key in _FIELDS.items():
        value = lin.get(key[4:]) if key.startswith("lin.") else text.get(key)
        out[name] = tuple(value) if isinstance(value, list) else value
    return out


def config_for(model: ModelSpec) -> dict[str, Any]:
    """A config.json with a catalog model's architecture (e.g. the real K3 numbers for admission tests)."""
    arch = model.architecture
    text: dict[str, Any] = {"model_type": arch.text_model_type, "linear_attn_config": {}}
    for name, key in _FIELDS.items():
        value = getattr(arch, name)
        value = list(value) if isinstance(value, tuple) else value
        if key.startswith("lin."):
            text["linear_attn_config"][key[4:]] = value
        else:
            text[key] = value
    fmt = "mxfp4-pack-quantized" if model.weights.expert_format == "mxfp4" else model.weights.expert_format
    return {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": arch.model_type,
        "_name_or_path": model.hub_repo,
        "text_config": text,
        "quantization_config": {"quant_method": "compressed-tensors", "format": fmt, "group_size": 32},
    }


def _expert_format(config: Mapping[str, Any]) -> str:
    fmt = str((config.get("quantization_config") or {}).get("format", ""))
    return "mxfp4" if "mxfp4" in fmt else ("w4a8" if "w4a8" in fmt or "int" in fmt else "bf16")


def _ad_hoc(config: dict[str, Any], fields: dict[str, Any]) -> ModelSpec:
    # An unknown K3-shaped config: size it from its own tensor layout.
    from k3deploy.sim.tiny_config import payload_bytes

    sizes = payload_bytes(config)
    numeric = [k for k, v in fields.items() if not isinstance(v, str)]
    arch = Architecture(**fields, sources=dict.fromkeys(numeric, _SOURCE))
    weights = Weights(
        expert_format="mxfp4",
        expert_bits_per_weight=4.25,
        total_bytes=sizes["total"],
        routed_expert_bytes=sizes["routed_experts"],
        shard_count=1,
        sources=dict.fromkeys(
            ("expert_bits_per_weight", "total_bytes", "routed_expert_bytes", "shard_count"), _SOURCE
        ),
    )
    cache = CacheDtypes(kv_cache_dtype="bf16", ssm_state_dtype="fp32", conv_state_dtype="bf16", sources={})
    name = str(config.get("_name_or_path") or "k3-shaped")
    return ModelSpec(
        id=name,
        name=name,
        hub_repo=name,
        architecture=arch,
        weights=weights,
        cache=cache,
        quantization=None,
        sources={"total": _SOURCE},
    )


def model_spec(config: dict[str, Any]) -> ModelSpec:
    """The catalog model whose architecture config.json declares, else one sized from the config itself."""
    fields = architecture_fields(config)
    if any(v is None for v in fields.values()):
        missing = sorted(k for k, v in fields.items() if v is None)
        raise ModelError(f"config.json is not a Kimi K3 config (missing {', '.join(missing)})")
    name, fmt = config.get("_name_or_path"), _expert_format(config)
    matches = [
        m for m in load_catalog().models.values() if m.architecture.config_fields() == fields
    ]
    matches.sort(key=lambda m: (name not in (m.id, m.hub_repo), m.weights.expert_format != fmt))
    return matches[0] if matches else _ad_hoc(config, fields)


def hardware(env: Mapping[str, str]) -> HardwareSpec:
    """The accelerator this node pretends to have (K3SIM_GPU, a hardware catalog id)."""
    gpu = env.get(GPU_ENV) or DEFAULT_GPU
    catalog = load_catalog()
    if gpu not in catalog.hardware:
        raise ModelError(
            f"{GPU_ENV}={gpu} is not a hardware catalog id (known: {', '.join(sorted(catalog.hardware))})"
        )
    return catalog.hardware[gpu]


def missing_shards(model_path: str | Path) -> list[str]:
    """Weight files the index names that are not on disk (no index: nothing to check)."""
    index = Path(model_path) / INDEX_FILE
    if not index.is_file():
        return []
    names = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
    return sorted(n for n in names if not (Path(model_path) / n).is_file())
