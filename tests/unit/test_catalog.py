"""The catalog: every number sourced, formulas agree with the stored sizes, user overrides work."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.catalog.cache import cache_file, cached_catalog
from k3deploy.catalog.loader import DATA_DIR, load_catalog, validate_catalog
from k3deploy.catalog.specs import Catalog
from k3deploy.errors import InputError
from k3deploy.planning.memory import bf16_bytes, packed_mxfp4_bytes

pytestmark = pytest.mark.timeout(30)
GIB = 1 << 30


def test_required_hardware_present() -> None:
    cat = load_catalog()
    for hw in ("h100-80gb", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x",
               "ascend-a2", "ascend-a3", "sim"):
        assert hw in cat.hardware
    assert cat.gpu("h100-80gb").usable_gib == 79.19
    assert cat.gpu("h100-80gb").arch == "sm90" and not cat.gpu("h100-80gb").native_mxfp4
    assert cat.gpu("b200").native_mxfp4 and cat.vendor("ascend-a3").collective == "hccl"


def test_k3_weights_match_formula() -> None:
    m = load_catalog().model("kimi-k3")
    a = m.architecture
    assert (a.num_hidden_layers, len(a.kda_layers), len(a.full_attn_layers)) == (93, 69, 24)
    assert a.full_attn_layers[-3:] == (88, 92, 93) and a.full_attn_layers[0] == 4
    assert m.weights.total_bytes == 1_560_860_324_864
    assert round(m.weights.total_bytes / GIB, 1) == 1453.7
    assert a.routed_expert_elems * 0.53125 == m.weights.routed_expert_bytes
    assert round(m.weights.routed_expert_bytes / GIB, 2) == 1347.12
    assert round(m.weights.non_expert_bytes / GIB, 1) == 106.5
    assert a.moe_layers * a.num_experts * 3 == 247_296


def test_mxfp4_vs_bf16_blowup() -> None:
    elems = load_catalog().model("kimi-k3").architecture.routed_expert_elems
    packed = packed_mxfp4_bytes(elems)
    assert packed == elems * 4 / 8 + elems / 32
    assert bf16_bytes(elems) / packed > 3.5


def test_tiny_catalog_matches_checkpoint_writer() -> None:
    from k3deploy.sim.tiny_config import payload_bytes, tiny_config

    cfg = tiny_config()
    tiny = load_catalog().model("kimi-k3-tiny")
    sizes = payload_bytes(cfg)
    assert sizes["total"] == tiny.weights.total_bytes
    assert sizes["routed_experts"] == tiny.weights.routed_expert_bytes
    tc = cfg["text_config"]
    a = tiny.architecture
    assert tuple(tc["linear_attn_config"]["kda_layers"]) == a.kda_layers
    assert tuple(tc["linear_attn_config"]["full_attn_layers"]) == a.full_attn_layers
    for field in ("hidden_size", "num_attention_heads", "vocab_size", "num_experts", "kv_lora_rank",
                  "qk_rope_head_dim", "moe_intermediate_size", "routed_expert_hidden_size"):
        assert tc[field] == getattr(a, field), field


def test_user_catalog_adds_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        "hardware:\n"
        "  - {id: h100-80gb, name: H100 tuned, vendor: nvidia, arch: sm90, memory_gib: 79.65, usable_gib: 78.0,\n"
        "     bandwidth_tbps: 3.35, native_mxfp4: false, typical_gpus_per_node: 8,\n"
        "     sources: {memory_gib: a, usable_gib: b, bandwidth_tbps: c, native_mxfp4: d, typical_gpus_per_node: e}}\n"
        "  - {id: x200, name: X200, vendor: nvidia, arch: sm100, memory_gib: 300, usable_gib: 299,\n"
        "     bandwidth_tbps: 9, native_mxfp4: true, typical_gpus_per_node: 8,\n"
        "     sources: {memory_gib: a, usable_gib: b, bandwidth_tbps: c, native_mxfp4: d, typical_gpus_per_node: e}}\n")
    cat = load_catalog((tmp_path,))
    assert cat.gpu("h100-80gb").usable_gib == 78.0 and cat.gpu("x200").usable_gib == 299
    assert load_catalog().gpu("h100-80gb").usable_gib == 79.19


def test_user_catalog_missing_source_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "hardware:\n  - {id: y1, name: Y, vendor: nvidia, arch: sm90, memory_gib: 1, usable_gib: 1,\n"
        "     bandwidth_tbps: 1, native_mxfp4: false, typical_gpus_per_node: 8, sources: {}}\n")
    with pytest.raises(InputError, match="no source for"):
        load_catalog((tmp_path,))


def test_user_catalog_error_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        "hardware:\n  - {id: y2, name: Y, vendor: nvidia, arch: sm90, memory_gib: lots, usable_gib: 1,\n"
        "     bandwidth_tbps: 1, native_mxfp4: false, typical_gpus_per_node: 8,\n"
        "     sources: {memory_gib: a, usable_gib: b, bandwidth_tbps: c, native_mxfp4: d, typical_gpus_per_node: e}}\n")
    with pytest.raises(InputError, match=r"mine\.yaml: hardware\.y2\.memory_gib"):
        load_catalog((tmp_path,))


def test_packaged_catalog_validates_and_matches_what_plan_loads() -> None:
    packaged = sorted(DATA_DIR.glob("*.yaml"))
    assert validate_catalog(packaged) == load_catalog()


class CountingValidate:
    """Stands in for catalog validation; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Catalog:
        self.calls += 1
        return validate_catalog(sorted(DATA_DIR.glob("*.yaml")))


def _catalog_files(tmp_path: Path) -> list[Path]:
    """A copy of the packaged catalog files, to edit."""
    data = tmp_path / "data"
    data.mkdir()
    for src in sorted(DATA_DIR.glob("*.yaml")):
        (data / src.name).write_bytes(src.read_bytes())
    return sorted(data.glob("*.yaml"))


def test_catalog_cache_validates_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = _catalog_files(tmp_path)
    validate = CountingValidate()
    first = cached_catalog(files, validate)
    assert cached_catalog(files, validate) == first and validate.calls == 1
    assert cache_file() == tmp_path / "cache" / "k3deploy" / "catalog.pickle" and cache_file().is_file()
    files[0].write_bytes(files[0].read_bytes() + b"\n# edited\n")
    cached_catalog(files, validate)
    assert validate.calls == 2


@pytest.mark.parametrize("damage", [b"", b"not a pickle", b"\x80\x05truncated"])
def test_catalog_cache_ignores_a_damaged_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              damage: bytes) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = _catalog_files(tmp_path)
    validate = CountingValidate()
    cached_catalog(files, validate)
    cache_file().write_bytes(damage)
    assert cached_catalog(files, validate).gpu("h100-80gb").usable_gib == 79.19
    assert validate.calls == 2
    cached_catalog(files, validate)
    assert validate.calls == 2


def test_catalog_cache_unwritable_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    validate = CountingValidate()
    assert cached_catalog(_catalog_files(tmp_path), validate).model("kimi-k3").id == "kimi-k3"
    assert validate.calls == 1


@pytest.mark.parametrize("section", ["planner", "performance", "engines", "vendors"])
@pytest.mark.parametrize("empty", ["[]", "''", "0"])
def test_a_mapping_section_given_an_empty_non_mapping_is_an_input_error(tmp_path: Path, section: str,
                                                                       empty: str) -> None:
    """`planner: []` (found by the catalog fuzzer) was an internal error: only absent or null is empty."""
    (tmp_path / "mine.yaml").write_text(f"{section}: {empty}\n")
    with pytest.raises(InputError, match=rf"mine\.yaml: `{section}` must be a mapping"):
        load_catalog((tmp_path,))


def perf_yaml(hbm_efficiency: float) -> str:
    """A user catalog overriding SGLang's performance factors."""
    factors = (f"hbm_efficiency: {hbm_efficiency}, compute_efficiency: 0.3, layer_overhead_us: 20, "
               "collectives: true, prefill_stalls_decode: true, kda_state_passes: 2")
    sources = "hbm_efficiency: a, compute_efficiency: b, layer_overhead_us: c, kda_state_passes: d"
    return f"performance:\n  sglang: {{{factors},\n    sources: {{{sources}}}}}\n"


def test_a_user_catalog_can_set_the_performance_factors_of_an_engine(tmp_path: Path) -> None:
    (tmp_path / "perf.yaml").write_text(perf_yaml(0.7))
    assert load_catalog((tmp_path,)).performance["sglang"].hbm_efficiency == 0.7
    (tmp_path / "bad").mkdir()  # another folder: load_catalog caches by folder
    (tmp_path / "bad" / "perf.yaml").write_text(perf_yaml(1.5))
    with pytest.raises(InputError, match=r"performance\.sglang\.hbm_efficiency"):
        load_catalog((tmp_path / "bad",))
