"""Tiny K3-shaped checkpoints on disk: safetensors shards, index, config.json and a sha256 manifest, with
the faults the shards stage must catch (truncated shard, flipped byte, missing tensor, wrong dtype)."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import struct
from pathlib import Path
from typing import Any, Literal

import numpy as np

from k3deploy.checkpoint.manifest import CONFIG_FILE, INDEX_FILE, MANIFEST_FILE, Manifest, create_manifest
from k3deploy.sim.tiny_config import TensorSpec, payload_bytes, tensor_specs, tiny_config
from k3deploy.sim.tokenizer_files import write_tokenizer_files

__all__ = [
    "CONFIG_FILE",
    "CORRUPTIONS",
    "INDEX_FILE",
    "MANIFEST_FILE",
    "Manifest",
    "TensorSpec",
    "payload_bytes",
    "shard_name",
    "shard_ranges",
    "tensor_bytes",
    "tensor_specs",
    "tiny_config",
    "write_checkpoint",
    "write_safetensors",
]

Corruption = Literal["truncate", "flip", "missing-tensor", "wrong-dtype"]
CORRUPTIONS: tuple[Corruption, ...] = ("truncate", "flip", "missing-tensor", "wrong-dtype")
# A wrong dtype as a careless conversion leaves it: same bytes, another label.
WRONG_DTYPE = "F16"


def tensor_bytes(spec: TensorSpec, rng: np.random.Generator) -> bytes:
    """Random contents for one tensor: BF16 weights of std 0.02, norms 1.0, E8M0 scales, packed bytes."""
    n = math.prod(spec.shape)
    if spec.name.endswith("_scale"):
        # E8M0 exponents near 2^-8, the magnitude a 0.02-std weight group needs.
        return rng.integers(117, 122, size=n, dtype=np.uint8).tobytes()
    if spec.dtype == "U8":
        return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
    if spec.name.endswith("norm.weight"):
        return np.full(n, 0x3F80, dtype="<u2").tobytes()  # bf16 1.0
    values = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).astype("<f4")
    return (values.view("<u4") >> 16).astype("<u2").tobytes()  # bf16 = upper half of fp32


def shard_name(k: int, shards: int) -> str:
    """The file name of shard k (0-based) of `shards`, as the hub names them."""
    return f"model-{k + 1:05d}-of-{shards:05d}.safetensors"


def shard_ranges(specs: list[TensorSpec], shards: int) -> list[range]:
    # Contiguous runs of roughly equal bytes, each non-empty, like real layer-ordered shards.
    if not 1 <= shards <= len(specs):
        raise ValueError(f"shards must be between 1 and {len(specs)}, got {shards}")
    offsets = [0, *itertools.accumulate(s.nbytes for s in specs)][:-1]
    total = offsets[-1] + specs[-1].nbytes
    starts: list[int] = []
    for k in range(shards):
        first = bisect.bisect_left(offsets, k * total / shards)
        lowest = starts[-1] + 1 if starts else 0
        starts.append(min(max(first, lowest), len(specs) - (shards - k)))
    bounds = [*starts, len(specs)]
    return [range(bounds[k], bounds[k + 1]) for k in range(shards)]


def write_safetensors(path: Path, specs: list[TensorSpec], blobs: list[bytes],
                       dtypes: dict[str, str] | None = None) -> int:
    """Write one shard (dtype labels overridden by `dtypes`) and return the offset where tensor data starts."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec, blob in zip(specs, blobs, strict=True):
        header[spec.name] = {
            "dtype": (dtypes or {}).get(spec.name, spec.dtype),
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header so data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for blob in blobs:
            f.write(blob)
    return 8 + len(raw)


def write_checkpoint(
    directory: Path | str,
    *,
    revision: str = "tiny-r1",
    shards: int = 4,
    seed: int = 0,
    corrupt: Corruption | None = None,
    corrupt_shard: int = 1,
) -> Manifest:
    """Write a kimi-k3-tiny checkpoint (shards, index, config, manifest) and return its manifest; `corrupt`
    then damages shard number `corrupt_shard` (1-based), and the manifest keeps the intact digests."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    specs = tensor_specs(config)
    # Contents depend on seed and revision only; sizes depend on the config only.
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}:{revision}".encode()).digest()[:8], "big"))
    weight_map: dict[str, str] = {}
    written: list[tuple[Path, list[TensorSpec], list[bytes], int]] = []
    for k, idx in enumerate(shard_ranges(specs, shards)):
        path = out / shard_name(k, shards)
        shard_specs = [specs[i] for i in idx]
        blobs = [tensor_bytes(s, rng) for s in shard_specs]
        written.append((path, shard_specs, blobs, write_safetensors(path, shard_specs, blobs)))
        weight_map.update({s.name: path.name for s in shard_specs})
    index = {
        "metadata": {"total_size": sum(s.nbytes for s in specs)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer_files(out, config["text_config"]["max_position_embeddings"])
    manifest = create_manifest(out, revision=revision, threads=1)
    manifest = manifest.model_copy(update={"source": f"k3deploy.sim seed {seed}"})
    (out / MANIFEST_FILE).write_text(manifest.dump())
    if corrupt is not None:
        if not 1 <= corrupt_shard <= shards:
            raise ValueError(f"corrupt_shard must be between 1 and {shards}, got {corrupt_shard}")
        _corrupt(corrupt, *written[corrupt_shard - 1])
    return manifest


def _corrupt(how: Corruption, path: Path, specs: list[TensorSpec], blobs: list[bytes], data_start: int) -> None:
    size = path.stat().st_size
    if how == "truncate":
        with path.open("r+b") as f:
            f.truncate(size // 2)
    elif how == "flip":
        position = data_start + (size - data_start) // 2  # inside the tensor data, never the header
        with path.open("r+b") as f:
            f.seek(position)
            byte = f.read(1)[0]
            f.seek(position)
            f.write(bytes([byte ^ 0xFF]))
    elif how == "missing-tensor":
        # The shard loses one tensor (an expert scale when it has one) that the index still names.
        scales = [i for i, s in enumerate(specs) if s.name.endswith("weight_scale")]
        drop = scales[-1] if scales else len(specs) - 1
        write_safetensors(path, specs[:drop] + specs[drop + 1:], blobs[:drop] + blobs[drop + 1:])
    else:
        victim = next(s for s in specs if s.dtype == "BF16")
        write_safetensors(path, specs, blobs, {victim.name: WRONG_DTYPE})
