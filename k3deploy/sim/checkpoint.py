"""Tiny K3-shaped checkpoints on disk: safetensors shards, index, config.json and a sha256 manifest."""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from k3deploy.sim.tiny_config import TensorSpec, payload_bytes, tensor_specs, tiny_config
from k3deploy.sim.tokenizer_files import write_tokenizer_files

__all__ = [
    "FileDigest",
    "Manifest",
    "TensorSpec",
    "payload_bytes",
    "tensor_specs",
    "tiny_config",
    "verify_checkpoint",
    "write_checkpoint",
]

Corruption = Literal["truncate", "flip"]

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
MANIFEST_FILE = "k3-manifest.json"


@dataclass(frozen=True)
class FileDigest:
    """Expected sha256 and size of one checkpoint file."""

    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """Pinned revision and per-file digests of a checkpoint directory."""

    revision: str
    files: dict[str, FileDigest]

    def to_json(self) -> dict[str, Any]:
        """Return the k3-manifest.json content."""
        files = {n: {"sha256": d.sha256, "size": d.size} for n, d in sorted(self.files.items())}
        return {"revision": self.revision, "files": files}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """Build a manifest from parsed k3-manifest.json content."""
        files = {n: FileDigest(sha256=d["sha256"], size=int(d["size"])) for n, d in data["files"].items()}
        return cls(revision=str(data["revision"]), files=files)

    @classmethod
    def load(cls, directory: Path | str) -> Manifest:
        """Read k3-manifest.json from a checkpoint directory."""
        return cls.from_json(json.loads((Path(directory) / MANIFEST_FILE).read_text()))


def _tensor_bytes(spec: TensorSpec, rng: np.random.Generator) -> bytes:
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


def _shard_ranges(specs: list[TensorSpec], shards: int) -> list[range]:
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


def _write_safetensors(path: Path, specs: list[TensorSpec], blobs: list[bytes]) -> int:
    """Write one shard and return the byte offset where tensor data starts."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec, blob in zip(specs, blobs, strict=True):
        header[spec.name] = {
            "dtype": spec.dtype,
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


def _digest(path: Path) -> FileDigest:
    return FileDigest(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), size=path.stat().st_size)


def write_checkpoint(
    directory: Path | str,
    *,
    revision: str = "tiny-r1",
    shards: int = 4,
    seed: int = 0,
    corrupt: Corruption | None = None,
) -> Manifest:
    """Write a kimi-k3-tiny checkpoint (shards, index, config, manifest) and return its manifest."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config()
    specs = tensor_specs(config)
    # Contents depend on seed and revision only; sizes depend on the config only.
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{seed}:{revision}".encode()).digest()[:8], "big"))
    ranges = _shard_ranges(specs, shards)
    weight_map: dict[str, str] = {}
    data_starts: dict[str, int] = {}
    for k, idx in enumerate(ranges):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        shard_specs = [specs[i] for i in idx]
        blobs = [_tensor_bytes(s, rng) for s in shard_specs]
        data_starts[name] = _write_safetensors(out / name, shard_specs, blobs)
        weight_map.update({s.name: name for s in shard_specs})
    index = {
        "metadata": {"total_size": sum(s.nbytes for s in specs)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    tokenizer = write_tokenizer_files(out, config["text_config"]["max_position_embeddings"])
    files = {name: _digest(out / name) for name in [*data_starts, INDEX_FILE, CONFIG_FILE, *tokenizer]}
    manifest = Manifest(revision=revision, files=files)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    if corrupt is not None:
        victim = next(iter(data_starts))
        _corrupt(out / victim, corrupt, data_starts[victim])
    return manifest


def _corrupt(path: Path, how: Corruption, data_start: int) -> None:
    size = path.stat().st_size
    if how == "truncate":
        with path.open("r+b") as f:
            f.truncate(size // 2)
        return
    position = data_start + (size - data_start) // 2  # inside the tensor data, never the header
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0xFF]))


def verify_checkpoint(directory: Path | str, manifest: Manifest | None = None) -> list[str]:
    """Return the names of files that are missing or disagree with the manifest (empty when intact)."""
    out = Path(directory)
    expected = manifest if manifest is not None else Manifest.load(out)
    bad = []
    for name, want in sorted(expected.files.items()):
        path = out / name
        if not path.is_file() or path.stat().st_size != want.size or _digest(path) != want:
            bad.append(name)
    return bad
