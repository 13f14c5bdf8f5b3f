"""A full-scale K3 checkpoint as sparse files: real tensor names, dtypes, shapes and shard count, holes for
payloads (about 1.56 TB apparent, a few hundred MB on disk), so header checks run at the real size."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

from k3deploy.sim.checkpoint import CONFIG_FILE, INDEX_FILE, shard_name, shard_ranges
from k3deploy.sim.tiny_config import TensorSpec, tensor_specs, tiny_config

# Layer 0's dense FFN width is not in the reference; the stand-in's own choice (it only sizes one BF16 layer).
DENSE_INTERMEDIATE = 18432


def full_config(architecture: dict[str, Any]) -> dict[str, Any]:
    """config.json at K3's real sizes: the tiny config's fields with the catalog architecture's values."""
    config = copy.deepcopy(tiny_config())
    config["_name_or_path"] = "moonshotai/Kimi-K3"
    t = config["text_config"]
    names = ("num_hidden_layers", "first_k_dense_replace", "hidden_size", "num_attention_heads",
             "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
             "v_head_dim", "vocab_size", "num_experts", "num_experts_per_token", "num_shared_experts",
             "moe_intermediate_size", "routed_expert_hidden_size", "max_position_embeddings")
    t.update({n: architecture[n] for n in names}, intermediate_size=DENSE_INTERMEDIATE)
    t["linear_attn_config"].update(
        kda_layers=list(architecture["kda_layers"]), full_attn_layers=list(architecture["full_attn_layers"]),
        num_heads=architecture["kda_num_heads"], head_dim=architecture["kda_head_dim"],
        short_conv_kernel_size=architecture["short_conv_kernel_size"])
    return config


def _write_sparse_shard(path: Path, specs: list[TensorSpec]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # a hole: no payload blocks are allocated


def write_sparse_checkpoint(directory: Path | str, architecture: dict[str, Any], *, shards: int = 96) -> int:
    """Write the sparse checkpoint (shards, index, config) and return its tensor payload bytes."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = full_config(architecture)
    specs = tensor_specs(config)
    weight_map: dict[str, str] = {}
    for k, idx in enumerate(shard_ranges(specs, shards)):
        name = shard_name(k, shards)
        shard_specs = specs[idx.start:idx.stop]
        _write_sparse_shard(out / name, shard_specs)
        weight_map.update({s.name: name for s in shard_specs})
    total = sum(s.nbytes for s in specs)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, separators=(",", ":")) + "\n")
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return total
