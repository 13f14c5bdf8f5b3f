"""Tiny K3-shaped checkpoints: layout, safetensors validity, index, manifest, corruption and CLI."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from k3deploy.checkpoint.manifest import verify_directory
from k3deploy.sim.checkpoint import (
    Manifest,
    payload_bytes,
    tensor_specs,
    tiny_config,
    write_checkpoint,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
EXPERT_NAME = re.compile(
    r"language_model\.model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w([123])\.(\w+)"
)
SHARD_NAME = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")


def _shard_keys(directory: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for shard in sorted(directory.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                assert key not in found, f"{key} in two shards"
                found[key] = shard.name
    return found


def test_tiny_config_has_k3_fields_at_tiny_sizes() -> None:
    config = tiny_config()
    assert config["architectures"] == ["KimiK3ForConditionalGeneration"]
    assert config["model_type"] == "kimi_k3"
    assert config["vision_config"] is None
    assert config["quantization_config"]["format"] == "mxfp4-pack-quantized"
    t = config["text_config"]
    assert t["model_type"] == "kimi_linear"
    lin = t["linear_attn_config"]
    assert sorted(lin["kda_layers"] + lin["full_attn_layers"]) == list(range(1, t["num_hidden_layers"] + 1))
    assert lin["full_attn_layers"][-1] == t["num_hidden_layers"]  # K3 ends on an MLA layer
    assert (t["hidden_size"], t["num_experts"], t["routed_expert_hidden_size"]) == (256, 32, 128)


def test_routed_expert_bytes_follow_the_reference_formula() -> None:
    t = tiny_config()["text_config"]
    moe_layers = t["num_hidden_layers"] - t["first_k_dense_replace"]
    formula = moe_layers * t["num_experts"] * 3 * t["moe_intermediate_size"] * t["routed_expert_hidden_size"]
    payload = payload_bytes(tiny_config())
    assert payload["routed_experts"] == formula * 0.53125
    assert payload["total"] == payload["routed_experts"] + payload["non_expert"]
    assert payload == {"total": 12_748_832, "routed_experts": 3_342_336, "non_expert": 9_406_496}


def test_layout_is_derived_from_config_and_scales_to_full_k3() -> None:
    config: dict[str, Any] = copy.deepcopy(tiny_config())
    t = config["text_config"]
    t.update(
        num_hidden_layers=93, num_experts=896, moe_intermediate_size=3072, routed_expert_hidden_size=3584
    )
    t["linear_attn_config"]["full_attn_layers"] = [*range(4, 93, 4), 93]
    t["linear_attn_config"]["kda_layers"] = [n for n in range(1, 94) if n % 4 and n != 93]
    # Reference: routed experts are 92 x 896 x 3 x 3072 x 3584 x 0.53125 B = 1347.12 GiB.
    assert payload_bytes(config)["routed_experts"] == 92 * 896 * 3 * 3072 * 3584 * 17 // 32
    assert round(payload_bytes(config)["routed_experts"] / 2**30, 2) == 1347.12


def test_routed_expert_names_and_shapes_match_the_reference() -> None:
    specs = tensor_specs(tiny_config())
    experts = [s for s in specs if ".experts." in s.name]
    assert len(experts) == 8 * 32 * 3 * 2
    for spec in experts:
        match = EXPERT_NAME.fullmatch(spec.name)
        assert match, spec.name
        assert spec.dtype == "U8"
        w, kind = match.group(3), match.group(4)
        out_dim, in_dim = (128, 64) if w == "2" else (64, 128)
        assert spec.shape == ((out_dim, in_dim // 2) if kind == "weight_packed" else (out_dim, in_dim // 32))
    others = [s for s in specs if ".experts." not in s.name]
    assert all(s.dtype == "BF16" for s in others)
    assert len({s.name for s in specs}) == len(specs)


@pytest.mark.torch  # safetensors' framework="pt" hands back torch tensors
def test_shards_open_with_safetensors_and_match_specs(checkpoint_manifest: tuple[Path, Manifest]) -> None:
    directory, _ = checkpoint_manifest
    specs = {s.name: s for s in tensor_specs(tiny_config())}
    shards = sorted(directory.glob("model-*.safetensors"))
    assert [SHARD_NAME.fullmatch(p.name) is not None for p in shards] == [True] * 4
    seen = 0
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensor = f.get_tensor(key)
                spec = specs[key]
                assert tuple(tensor.shape) == spec.shape, key
                assert str(tensor.dtype) == {"BF16": "torch.bfloat16", "U8": "torch.uint8"}[spec.dtype], key
                seen += 1
    assert seen == len(specs)


def test_index_agrees_with_shards(checkpoint_manifest: tuple[Path, Manifest]) -> None:
    directory, _ = checkpoint_manifest
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == _shard_keys(directory)
    assert index["metadata"]["total_size"] == sum(s.nbytes for s in tensor_specs(tiny_config()))
    assert index["metadata"]["total_size"] == payload_bytes(tiny_config())["total"]
    assert json.loads((directory / "config.json").read_text()) == tiny_config()


def test_manifest_matches_files(checkpoint_manifest: tuple[Path, Manifest]) -> None:
    directory, manifest = checkpoint_manifest
    assert Manifest.load(directory) == manifest
    assert manifest.revision == "tiny-r1"
    assert set(manifest.files) == {p.name for p in directory.iterdir()} - {"k3-manifest.json"}
    assert verify_directory(directory, Manifest.load(directory)) == []


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_corruption_breaks_exactly_one_file(tmp_path: Path, how: str) -> None:
    manifest = write_checkpoint(tmp_path, corrupt=how)  # type: ignore[arg-type]
    assert manifest == write_checkpoint(tmp_path / "clean")  # the manifest records the good hashes
    bad = verify_directory(tmp_path, manifest)
    assert len(bad) == 1 and SHARD_NAME.fullmatch(bad[0])
    size = (tmp_path / bad[0]).stat().st_size
    if how == "flip":
        assert size == manifest.files[bad[0]].size
    else:
        assert size < manifest.files[bad[0]].size


def test_revision_changes_contents_not_sizes(tmp_path: Path) -> None:
    r1 = write_checkpoint(tmp_path / "r1", revision="tiny-r1")
    r2 = write_checkpoint(tmp_path / "r2", revision="tiny-r2")
    again = write_checkpoint(tmp_path / "again", revision="tiny-r1")
    assert again == r1  # deterministic
    assert {n: d.size for n, d in r1.files.items()} == {n: d.size for n, d in r2.files.items()}
    for name in r1.files:
        if SHARD_NAME.fullmatch(name):
            assert r1.files[name].sha256 != r2.files[name].sha256, name
    assert verify_directory(tmp_path / "r2", r1) == sorted(n for n in r1.files if SHARD_NAME.fullmatch(n))


@pytest.mark.parametrize("shards", [1, 3, 7])
def test_shard_count_is_respected(tmp_path: Path, shards: int) -> None:
    write_checkpoint(tmp_path, shards=shards)
    names = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert names == [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    assert len(_shard_keys(tmp_path)) == len(tensor_specs(tiny_config()))


def test_writes_quickly_and_stays_small(tmp_path: Path) -> None:
    start = time.monotonic()
    manifest = write_checkpoint(tmp_path)
    assert time.monotonic() - start < 10
    assert sum(d.size for d in manifest.files.values()) < 20 * 2**20


def test_cli_make_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    cmd = [
        sys.executable,
        "-m",
        "k3deploy.sim",
        "make-checkpoint",
        str(out),
        "--revision",
        "r9",
        "--shards",
        "2",
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert result.returncode == 0, result.stderr
    manifest = Manifest.load(out)
    assert manifest.revision == "r9"
    assert verify_directory(out, manifest) == []
    assert len(list(out.glob("model-*-of-00002.safetensors"))) == 2


def test_cli_corrupt_flag_and_help(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "k3deploy.sim", "make-checkpoint", str(tmp_path), "--corrupt", "truncate"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert result.returncode == 0, result.stderr
    assert len(verify_directory(tmp_path, Manifest.load(tmp_path))) == 1
    help_cmd = [sys.executable, "-m", "k3deploy.sim", "--help"]
    shown = subprocess.run(help_cmd, cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    help_text = " ".join(shown.stdout.split())  # argparse wraps lines
    assert "not a model server" in help_text and "tests and demos" in help_text
