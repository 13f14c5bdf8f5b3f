"""The real-engine tier's assets: the tiny checkpoints (real safetensors, a real tokenizer) agree with the
catalog entries that describe them (tests/assets/catalog), so every stage judges them by their own facts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.checkpoint.manifest import Manifest, verify_directory
from k3deploy.planning.memory import mla_kv_bytes_per_token
from k3deploy.probes import shard_names, shard_structure
from k3deploy.validate.stages.shards import config_expectations
from tests.realengine.checkpoints import (
    CATALOG_DIR,
    DEEPSEEK_ID,
    LLAMA_ID,
    deepseek_config,
    deepseek_tensors,
    llama_config,
    llama_tensors,
    write_deepseek,
    write_llama,
)

CASES = {LLAMA_ID: (write_llama, llama_tensors, llama_config), DEEPSEEK_ID: (write_deepseek, deepseek_tensors,
                                                                            lambda: deepseek_config())}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real-ckpt")
    return {model_id: write(root / model_id) for model_id, (write, _t, _c) in CASES.items()}


@pytest.mark.parametrize("model_id", sorted(CASES))
def test_catalog_entry_matches_the_written_checkpoint(written: dict[str, Path], model_id: str) -> None:
    spec = load_catalog((CATALOG_DIR,)).model(model_id)
    _write, tensors, config = CASES[model_id]
    specs = tensors(config())
    assert spec.weights.total_bytes == sum(s.nbytes for s in specs)
    experts = sum(s.nbytes for s in specs if ".mlp.experts." in s.name)
    assert spec.weights.routed_expert_bytes == experts
    root = written[model_id]
    on_disk = json.loads((root / "config.json").read_text())
    assert shard_structure.config_problems(on_disk, config_expectations(spec)) == []
    assert len(config_expectations(spec)) >= 8  # the entry is checked against config.json, not skipped


@pytest.mark.parametrize("model_id", sorted(CASES))
def test_single_file_checkpoint_passes_the_structure_check_and_has_a_manifest(written: dict[str, Path],
                                                                             model_id: str) -> None:
    root = written[model_id]
    assert not (root / shard_names.INDEX_FILE).exists() and (root / shard_names.SINGLE_FILE).is_file()
    spec = load_catalog((CATALOG_DIR,)).model(model_id)
    assert shard_structure.structure(str(root), config_expectations(spec), workers=1) == []
    manifest = Manifest.load(root)
    assert shard_names.SINGLE_FILE in manifest.files and len(manifest.weight_map) == len(CASES[model_id][1](
        CASES[model_id][2]()))
    assert verify_directory(root, manifest) == []


def test_a_damaged_single_file_is_caught(tmp_path: Path) -> None:
    root = write_llama(tmp_path / "llama")
    blob = (root / shard_names.SINGLE_FILE).read_bytes()
    (root / shard_names.SINGLE_FILE).write_bytes(blob[: len(blob) // 2])
    found = shard_structure.structure(str(root), {}, workers=1)
    assert [p["file"] for p in found] == [shard_names.SINGLE_FILE] and "bytes short" in found[0]["message"], found


def test_sharded_form_has_an_index(tmp_path: Path) -> None:
    root = write_deepseek(tmp_path / "ds", shards=3)
    assert (root / shard_names.INDEX_FILE).is_file() and not (root / shard_names.SINGLE_FILE).exists()
    spec = load_catalog((CATALOG_DIR,)).model(DEEPSEEK_ID)
    assert shard_structure.structure(str(root), config_expectations(spec), workers=1) == []


def test_the_tokenizer_is_real_and_exactly_the_vocab(written: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(written[LLAMA_ID] / "tokenizer.json"))
    assert tok.get_vocab_size() == llama_config()["vocab_size"]
    text = "Session 3f2a. The access code of room-1 is QX7-K2M? Ünïcode too."
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: no unknown token
    config = json.loads((written[LLAMA_ID] / "tokenizer_config.json").read_text())
    assert "{{ bos_token }}" in config["chat_template"] and config["eos_token"] == "</s>"


def test_gqa_kv_bytes_follow_the_kv_heads() -> None:
    arch = load_catalog((CATALOG_DIR,)).model(LLAMA_ID).architecture
    # 2 layers x K and V x 2 KV heads x head_dim 32 x 2 bytes; TP 2 holds one KV head each, TP 4 replicates.
    assert mla_kv_bytes_per_token(arch, "bf16") == 2 * 2 * 2 * 32 * 2
    assert mla_kv_bytes_per_token(arch, "bf16", attn_tp=2) == 2 * 2 * 1 * 32 * 2
    assert mla_kv_bytes_per_token(arch, "bf16", attn_tp=4) == 2 * 2 * 1 * 32 * 2
