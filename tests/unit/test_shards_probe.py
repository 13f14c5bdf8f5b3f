"""The stdlib-only shard probe, run as nodes run it (`python3 -c SOURCE SPEC`), on real checkpoints."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.probes import fast_json, shard_inventory, shard_names, shards
from k3deploy.probes.bundle import program
from k3deploy.sim.checkpoint import Manifest, write_checkpoint
from k3deploy.sim.sparse_checkpoint import write_sparse_checkpoint

pytestmark = pytest.mark.timeout(120)
SOURCE = program(shards)
SHARD1 = "model-00001-of-00004.safetensors"


def probe(path: Path, site: bool = False, **spec: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(progress lines, result) of the probe run in an isolated interpreter: no k3deploy, and no site-packages
    unless `site` (then the JSON parsers installed here are found, as in an engine's interpreter)."""
    args = [sys.executable, "-I", *([] if site else ["-S"]), "-c", SOURCE, json.dumps({"path": str(path), **spec})]
    done = subprocess.run(args, capture_output=True, text=True, timeout=100, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines and lines[-1]["type"] == "result"
    assert all(line["type"] == "progress" for line in lines[:-1])
    return lines[:-1], lines[-1]


def messages(result: dict[str, Any]) -> list[str]:
    return [p["message"] for p in result["problems"]]


def expect_of(model_id: str) -> dict[str, Any]:
    from k3deploy.validate.stages.shards import config_expectations

    return config_expectations(load_catalog().model(model_id))


def test_clean_checkpoint_passes_and_digests_match_the_manifest(checkpoint_manifest: tuple[Path, Manifest]) -> None:
    path, manifest = checkpoint_manifest
    progress, result = probe(path, expect=expect_of("kimi-k3-tiny"), files=manifest.expected(), progress_s=0.01)
    assert result["problems"] == [] and result["missing"] == []
    assert {n: tuple(v) for n, v in result["files"].items()} == {n: (d.size, d.sha256) for n, d in manifest.files.items()}
    assert (result["revision"], result["revision_from"]) == ("tiny-r1", "k3-manifest.json")
    assert result["hashed_bytes"] == sum(d.size for d in manifest.files.values())
    if progress:  # a fast machine may finish before the first tick
        assert progress[-1]["total"] == result["hashed_bytes"] and progress[-1]["files"] == len(manifest.files)


@pytest.mark.parametrize(("fault", "expected"), [
    ("truncate", r"shard 00002: [\d,]+ bytes short \(file [\d,]+, header says [\d,]+\)"),
    ("missing-tensor", (r"shard 00002: tensor language_model\.model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.w\d"
                       r"\.weight_scale missing from shard 00002")),
    ("wrong-dtype", r"shard 00002: tensor language_model\.\S+: dtype F16, expected BF16"),
])
def test_each_structural_fault_is_named_with_its_shard(tmp_path: Path, fault: str, expected: str) -> None:
    write_checkpoint(tmp_path, corrupt=fault, corrupt_shard=2)  # type: ignore[arg-type]
    _, result = probe(tmp_path, expect=expect_of("kimi-k3-tiny"), hash=False)
    assert {p["file"] for p in result["problems"]} == {"model-00002-of-00004.safetensors"}, result["problems"]
    assert any(re.fullmatch(expected, m) for m in messages(result)), messages(result)


def test_a_flipped_byte_passes_structure_and_changes_the_digest(tmp_path: Path) -> None:
    manifest = write_checkpoint(tmp_path, corrupt="flip")
    _, result = probe(tmp_path, expect=expect_of("kimi-k3-tiny"), files=manifest.expected())
    assert result["problems"] == []
    changed = [n for n, (size, sha) in result["files"].items() if [size, sha] != manifest.expected()[n]]
    assert changed == [SHARD1]


def test_config_against_another_catalog_entry_names_each_field(checkpoint_manifest: tuple[Path, Manifest]) -> None:
    _, result = probe(checkpoint_manifest[0], expect=expect_of("kimi-k3"), hash=False)
    found = messages(result)
    assert "config.json: text_config.hidden_size is 256, the catalog says 7168" in found
    assert "config.json: text_config.num_experts is 32, the catalog says 896" in found
    assert all(p["file"] == "config.json" for p in result["problems"])


def _shard(path: Path, header: dict[str, Any], payload: int, header_len: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", header_len if header_len is not None else len(raw)) + raw + b"\0" * payload)


def test_holes_overlaps_spans_caps_and_missing_shards(tmp_path: Path, checkpoint_manifest: tuple[Path, Manifest]) -> None:
    for f in checkpoint_manifest[0].iterdir():
        shutil.copy(f, tmp_path / f.name)
    a = "model-00001-of-00004.safetensors"
    index = json.loads((tmp_path / shard_names.INDEX_FILE).read_text())
    names = [t for t, s in index["weight_map"].items() if s == a]
    index["weight_map"] = {n: a for n in names[:3]} | {"x.weight": "model-00009-of-00009.safetensors"}
    (tmp_path / shard_names.INDEX_FILE).write_text(json.dumps(index))
    bf16 = {"dtype": "BF16", "shape": [4]}
    _shard(tmp_path / a, {names[0]: {**bf16, "data_offsets": [0, 8]}, names[1]: {**bf16, "data_offsets": [16, 24]},
                          names[2]: {**bf16, "data_offsets": [20, 30]}}, 30)
    found = "\n".join(messages(probe(tmp_path, hash=False)[1]))
    assert f"shard 00001: hole of 8 bytes before tensor {names[1]}" in found
    assert f"shard 00001: tensor {names[2]}: data_offsets span 10 bytes, BF16 [4] needs 8" in found
    assert f"shard 00001: tensor {names[2]} overlaps the tensor before it by 4 bytes" in found
    assert "shard 00009: missing (named by the index)" in found
    _shard(tmp_path / a, {}, 0, header_len=1 << 40)
    found = "\n".join(messages(probe(tmp_path, hash=False)[1]))
    assert "shard 00001: header length 1,099,511,627,776 exceeds the 268,435,456-byte cap" in found


def test_full_scale_sparse_k3_checkpoint_passes_structure(tmp_path: Path) -> None:
    arch = load_catalog().model("kimi-k3").architecture.model_dump()
    total = write_sparse_checkpoint(tmp_path, arch)
    shard_files = sorted(tmp_path.glob("*.safetensors"))
    assert len(shard_files) == 96
    assert sum(f.stat().st_size for f in shard_files) > total  # real sizes (headers + payload), held as holes
    assert sum(f.stat().st_blocks * 512 for f in shard_files) < total // 1000
    _, result = probe(tmp_path, expect=expect_of("kimi-k3"), hash=False)
    assert result["problems"] == []


def test_revision_hint_from_hub_download_metadata_and_snapshot_paths(tmp_path: Path, checkpoint_manifest: tuple[Path, Manifest]) -> None:
    sha = "f831ab6" + "0" * 33
    local = tmp_path / "local-dir"
    shutil.copytree(checkpoint_manifest[0], local, ignore=shutil.ignore_patterns("k3-manifest.json"))
    meta = local / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for name in ("config.json", "model-00001-of-00004.safetensors"):  # what `hf download --local-dir` leaves
        (meta / f"{name}.metadata").write_text(f"{sha}\n\"etag\"\n1764000000.0\n")
    assert shard_inventory.revision_hint(str(local)) == (sha, ".cache/huggingface/download")
    assert ".cache/huggingface/download/config.json.metadata" not in shard_inventory.local_files(str(local))
    snapshot = tmp_path / "models--moonshotai--Kimi-K3" / "snapshots" / sha
    snapshot.mkdir(parents=True)
    for f in local.iterdir():  # the hub cache: a snapshot directory of symlinks into blobs/
        (snapshot / f.name).symlink_to(f)
    shutil.rmtree(meta.parent.parent)
    assert shard_inventory.revision_hint(str(snapshot)) == (sha, "hub cache snapshot path")
    assert shard_inventory.revision_hint(str(local)) == (None, "")


def _odd_checkpoints(root: Path) -> list[Path]:
    """Checkpoints whose verdicts lean on the parser: each structural fault, a header that is not JSON, and an
    integer past 64 bits (orjson reads it as a float)."""
    out = []
    for fault in ("truncate", "missing-tensor", "wrong-dtype", None):
        path = root / (fault or "clean")
        write_checkpoint(path, corrupt=fault, corrupt_shard=2)  # type: ignore[arg-type]
        out.append(path)
    _shard(out[-1] / SHARD1, {"x": {"dtype": "U8", "shape": [2**70], "data_offsets": [0, 2**70]}}, 0)
    _shard(out[-1] / "model-00003-of-00004.safetensors", {}, 0)
    with (out[-1] / "model-00003-of-00004.safetensors").open("r+b") as f:
        f.seek(8)
        f.write(b"[")
    return out


@pytest.mark.parametrize("parser", fast_json.PARSERS)
def test_every_json_parser_gives_the_standard_librarys_result(tmp_path: Path, parser: str) -> None:
    if parser != "json" and importlib.util.find_spec(parser) is None:
        pytest.skip(f"{parser} is not installed in this interpreter (engines' interpreters carry it)")
    for path in _odd_checkpoints(tmp_path):
        _, alone = probe(path, expect=expect_of("kimi-k3-tiny"), hash=False)  # no site-packages: stdlib json
        _, chosen = probe(path, site=True, expect=expect_of("kimi-k3-tiny"), hash=False, json_parser=parser)
        assert alone["json_parser"] == "json" and chosen["json_parser"] == parser
        assert chosen["problems"] == alone["problems"], path.name
    assert any("header is not JSON" in m for m in messages(alone)), messages(alone)
    assert any("1,180,591,620,717,411,303,424 bytes short" in m for m in messages(alone)), messages(alone)


def test_the_fastest_parser_present_is_chosen_and_an_absent_one_is_named(tmp_path: Path) -> None:
    write_checkpoint(tmp_path)
    present = [p for p in fast_json.PARSERS if p == "json" or importlib.util.find_spec(p) is not None]
    assert probe(tmp_path, site=True, hash=False)[1]["json_parser"] == present[0]
    missing = next((p for p in fast_json.PARSERS if p != "json" and importlib.util.find_spec(p) is None), "msgspec")
    result = probe(tmp_path, hash=False, json_parser=missing)[1]  # without site-packages nothing but json is there
    assert result["fatal"] == f"JSON parser {missing} is not installed in this interpreter"
    assert probe(tmp_path, hash=False, json_parser="orjson")[1]["fatal"].startswith("unknown JSON parser 'orjson'")


def test_the_last_progress_tick_reports_every_byte_whichever_thread_ends_last(tmp_path: Path) -> None:
    # CI once saw a node's last tick short of its total: a thread that ended between two ticks was never reported
    paths = []
    for i, size in enumerate((300_000, 290_000, 5, 7, 11, 13)):
        (tmp_path / f"f{i}").write_bytes(b"x" * size)
        paths.append(str(tmp_path / f"f{i}"))
    total = sum(Path(p).stat().st_size for p in paths)
    for _ in range(40):
        ticks: list[tuple[int, int, int]] = []
        out = shard_inventory.sha256_files(paths, 3, lambda d, t, n, seen=ticks: seen.append((d, t, n)), 0.0001)
        assert len(out) == len(paths)
        assert ticks[-1] == (total, total, len(paths))
