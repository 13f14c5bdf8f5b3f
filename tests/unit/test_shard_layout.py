"""The structural check's bulk pass over a shard header (shard_layout.Layout.sound_experts) against the
per-tensor check that names faults (shard_structure.tensor_problems): the bulk pass may decline anything, but
whatever it passes the per-tensor check passes too, with the same routed-expert count."""
from __future__ import annotations

import copy
import gc
import json
import math
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3deploy.probes import shard_names, shard_structure
from k3deploy.probes.shard_layout import DTYPE_BITS, Layout
from k3deploy.sim.checkpoint import Manifest

pytestmark = pytest.mark.timeout(120)
Header = dict[str, Any]
SHARDS = [f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)]


@pytest.fixture(scope="module")
def tiny(checkpoint_manifest: tuple[Path, Manifest]) -> tuple[Layout, list[tuple[Header, int]]]:
    """The tiny K3 checkpoint's layout and each shard's header with its data bytes."""
    root = checkpoint_manifest[0]
    layout = Layout(json.loads((root / shard_names.CONFIG_FILE).read_text()))
    out = []
    for name in SHARDS:
        n, header, size = shard_structure.read_header(str(root / name))
        header.pop("__metadata__", None)
        out.append((header, size - 8 - n))
    return layout, out


def verdicts(layout: Layout, header: Header, data: int) -> tuple[int | None, tuple[list[str], int] | str]:
    """(bulk count or None, per-tensor (problems, count) or the exception it raised)."""
    fast = layout.sound_experts(copy.deepcopy(header), data)
    try:
        slow: tuple[list[str], int] | str = shard_structure.tensor_problems(copy.deepcopy(header), 0, 8 + data, layout)
    except (TypeError, ValueError, OverflowError) as exc:  # an odd value the per-tensor check does not survive
        slow = repr(exc)
    return fast, slow


def agree(fast: int | None, slow: tuple[list[str], int] | str) -> None:
    assert fast is None or slow == ([], fast), (fast, slow)


def test_each_sound_shard_passes_in_bulk_with_the_per_tensor_count(tiny: tuple[Layout, list[tuple[Header, int]]]) -> None:
    layout, shards = tiny
    for header, data in shards:
        fast, slow = verdicts(layout, header, data)
        assert fast is not None and fast > 0 and slow == ([], fast)
    assert sum(layout.sound_experts(h, d) or 0 for h, d in shards) == layout.expert_count


def _tensor(header: Header, fragment: str) -> str:
    return next(t for t in header if fragment in t)


def _edit(fragment: str, **fields: Any) -> Callable[[Header, int], tuple[Header, int]]:
    """Set fields of the first tensor whose name has the fragment."""
    def apply(header: Header, data: int) -> tuple[Header, int]:
        header[_tensor(header, fragment)].update(fields)
        return header, data
    return apply


def _rename(fragment: str, old: str, new: str) -> Callable[[Header, int], tuple[Header, int]]:
    """Rename the first tensor with the fragment in place (order kept)."""
    def apply(header: Header, data: int) -> tuple[Header, int]:
        name = _tensor(header, fragment)
        return {(t.replace(old, new) if t == name else t): v for t, v in header.items()}, data
    return apply


def _layer(fragment: str, layer: int) -> Callable[[Header, int], tuple[Header, int]]:
    """Move the first tensor with the fragment to another layer, by name."""
    def apply(header: Header, data: int) -> tuple[Header, int]:
        name = _tensor(header, fragment)
        moved = re.sub(r"layers\.\d+\.", f"layers.{layer}.", name)
        return {(moved if t == name else t): v for t, v in header.items()}, data
    return apply


def _shift(fragment: str, by: int, data_by: int = 0) -> Callable[[Header, int], tuple[Header, int]]:
    """Move every tensor from the first with the fragment on by `by` bytes (a hole, or an overlap if < 0)."""
    def apply(header: Header, data: int) -> tuple[Header, int]:
        names = list(header)
        for t in names[names.index(_tensor(header, fragment)):]:
            b, e = header[t]["data_offsets"]
            header[t]["data_offsets"] = [b + by, e + by]
        return header, data + data_by
    return apply


def _negative(header: Header, data: int) -> tuple[Header, int]:
    """A BF16 tensor of shape [-2] spanning -4 bytes, and the tensors after it moved to chain on from its end."""
    names = list(header)
    at = names.index(_tensor(header, PLAIN))
    begin, end = header[names[at]]["data_offsets"]
    header[names[at]].update(shape=[-2], data_offsets=[begin, begin - 4])
    by = begin - 4 - end
    for t in names[at + 1:]:
        header[t]["data_offsets"] = [x + by for x in header[t]["data_offsets"]]
    return header, data + by


def _reverse(header: Header, data: int) -> tuple[Header, int]:
    return dict(reversed(header.items())), data


def _zero_length_first(header: Header, data: int) -> tuple[Header, int]:
    return {"language_model.model.norm.empty": {"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}, **header}, data


PACKED, SCALE, PLAIN = ".experts.3.w1.weight_packed", ".experts.3.w2.weight_scale", "input_layernorm.weight"
MUTATIONS: dict[str, Callable[[Header, int], tuple[Header, int]]] = {
    "packed as F8_E8M0": _edit(PACKED, dtype="F8_E8M0"),
    "scale as F8_E8M0 (sound)": _edit(SCALE, dtype="F8_E8M0"),
    "scale as BF16": _edit(SCALE, dtype="BF16"),
    "plain as F16": _edit(PLAIN, dtype="F16"),
    "unknown dtype": _edit(PLAIN, dtype="Q4"),
    "dtype a list": _edit(PACKED, dtype=["U8"]),
    "no dtype": lambda h, d: (h[_tensor(h, PACKED)].pop("dtype"), (h, d))[1],
    "entry a list": lambda h, d: ({**h, _tensor(h, PACKED): [1, 2]}, d),
    "shape of floats (sound)": lambda h, d: _edit(PACKED, shape=[float(x) for x in h[_tensor(h, PACKED)]["shape"]])(h, d),
    "shape of bools": _edit(PACKED, shape=[True, True]),
    "shape a string": _edit(PLAIN, shape="ab"),
    "negative plain shape": _edit(PLAIN, shape=[-4]),
    "a negative span chained on": _negative,
    "huge plain shape": _edit(PLAIN, shape=[2 ** 70]),
    "offsets of three": _edit(PACKED, data_offsets=[0, 1, 2]),
    "offsets as strings": _edit(PLAIN, data_offsets=["a", "b"]),
    "offsets as floats (sound)": lambda h, d: _edit(PLAIN, data_offsets=[float(x) for x in h[_tensor(h, PLAIN)]["data_offsets"]])(h, d),
    "a hole": _shift(SCALE, 8, 8),
    "an overlap": _shift(SCALE, -2, -2),
    "trailing data": lambda h, d: (h, d + 8),
    "short": lambda h, d: (h, d - 1),
    "out of data order (sound)": _reverse,
    "zero-length tensor first (sound)": _zero_length_first,
    "layer written 05 (sound)": _rename(PACKED, "layers.", "layers.0"),
    "expert written 03 (sound)": _rename(PACKED, ".experts.3.", ".experts.03."),
    "expert past the last": _rename(PACKED, ".experts.3.", ".experts.32."),
    "unknown kind": _rename(PACKED, ".w1.", ".w4."),
    "expert of the dense layer": _layer(PACKED, 0),
    "expert past the last layer": _layer(PACKED, 9),
    "experts under another head": _rename(PACKED, "language_model.model.layers.", "vision.layers.x"),
    "vision tensor in F16 (sound)": lambda h, d: _edit("vision.", dtype="F16")(*_rename(PLAIN, "language_model", "vision.")(h, d)),
}


@pytest.mark.parametrize("shard", [0, 2])
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_bulk_check_passes_nothing_the_per_tensor_check_refuses(
        tiny: tuple[Layout, list[tuple[Header, int]]], shard: int, mutation: str) -> None:
    layout, shards = tiny
    try:
        header, data = MUTATIONS[mutation](copy.deepcopy(shards[shard][0]), shards[shard][1])
    except StopIteration:
        pytest.skip(f"shard {shard + 1} has no tensor this mutation edits")
    fast, slow = verdicts(layout, header, data)
    agree(fast, slow)
    if "(sound)" not in mutation:
        assert isinstance(slow, str) or slow[0], f"the mutation did not break shard {shard + 1}: {slow}"
    elif "order" not in mutation and "written 0" not in mutation:
        assert fast is not None, "a sound variant the bulk check should pass"


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                    | st.sampled_from(["U8", "BF16", "F8_E8M0", "F16", ""]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
                        ["dtype", "shape", "data_offsets"]), inner, max_size=3), max_leaves=6)


@settings(database=None, deadline=None, derandomize=True, max_examples=300,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_value_anywhere_gets_the_per_tensor_verdict(tiny: tuple[Layout, list[tuple[Header, int]]],
                                                        data: st.DataObject) -> None:
    layout, shards = tiny
    header, size = copy.deepcopy(shards[data.draw(st.sampled_from([0, 1, 2, 3]))])
    tensor = data.draw(st.sampled_from(sorted(header)))
    where = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "entry", "offset item", "shape item"]))
    value = data.draw(JSON)
    if where == "entry":
        header[tensor] = value
    elif where == "offset item":
        header[tensor]["data_offsets"][data.draw(st.sampled_from([0, 1]))] = value
    elif where == "shape item" and header[tensor]["shape"]:
        header[tensor]["shape"][0] = value
    else:
        header[tensor][where] = value
    agree(*verdicts(layout, header, size))


def test_structure_leaves_the_cyclic_collector_as_it_found_it(checkpoint_manifest: tuple[Path, Manifest]) -> None:
    root = str(checkpoint_manifest[0])
    assert gc.isenabled()
    assert shard_structure.structure(root, {}, workers=1) == []
    assert gc.isenabled()
    gc.disable()
    try:
        assert shard_structure.structure(root, {}, workers=1) == []
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_two_tensors_swapped_in_the_index_name_both_shards(tmp_path: Path,
                                                           checkpoint_manifest: tuple[Path, Manifest]) -> None:
    for f in checkpoint_manifest[0].iterdir():
        shutil.copy(f, tmp_path / f.name)
    index = json.loads((tmp_path / shard_names.INDEX_FILE).read_text())
    a = next(t for t, s in index["weight_map"].items() if s == SHARDS[0])
    b = next(t for t, s in index["weight_map"].items() if s == SHARDS[2])
    index["weight_map"][a], index["weight_map"][b] = SHARDS[2], SHARDS[0]
    (tmp_path / shard_names.INDEX_FILE).write_text(json.dumps(index))
    found = [p["message"] for p in shard_structure.structure(str(tmp_path), {}, workers=2)]
    assert found == [f"shard 00001: tensor {b} missing from shard 00001",
                     f"shard 00001: tensor {a} in shard 00001 but not in the index's weight_map",
                     f"shard 00003: tensor {a} missing from shard 00003",
                     f"shard 00003: tensor {b} in shard 00003 but not in the index's weight_map"], found


# A K3-shaped config small enough to write (one dense layer, one MoE layer of two experts), and msModelSlim's
# quant description of its W4A8 checkpoint: experts W4A8_DYNAMIC, attention W8A8_DYNAMIC, the rest FLOAT.
W4A8_CONFIG = {"text_config": {"num_hidden_layers": 2, "hidden_size": 16, "vocab_size": 32, "num_experts": 2,
                               "moe_intermediate_size": 8, "routed_expert_hidden_size": 4, "first_k_dense_replace": 1}}
MOE = "language_model.model.layers.1.block_sparse_moe.experts"
ATTN = "language_model.model.layers.1.self_attn.q_proj"
W4A8_QUANT = {"model_quant_type": "W4A8_DYNAMIC", "group_size": 0, f"{ATTN}.weight": "W8A8_DYNAMIC",
              "language_model.lm_head.weight": "FLOAT",
              **{f"{MOE}.{e}.{w}.weight": "W4A8_DYNAMIC" for e in range(2) for w in ("w1", "w2", "w3")}}


def w4a8_header(**odd: tuple[str, list[int]]) -> tuple[Header, int]:
    """The MoE layer's shard as vLLM-Ascend's W4A8 method reads it (w4a8.py): int8 [out // 2, in] experts with F32
    per-channel scale, offset and scale_bias ([out, 16] for w2); `odd` replaces a tensor's (dtype, shape)."""
    tensors: dict[str, tuple[str, list[int]]] = {"language_model.lm_head.weight": ("BF16", [32, 16]),
                                                 f"{ATTN}.weight": ("I8", [16, 16]),
                                                 f"{ATTN}.weight_scale": ("F32", [16, 1]),
                                                 f"{ATTN}.weight_offset": ("F32", [16, 1])}
    for e in range(2):
        for w, (out, inp) in {"w1": (8, 4), "w2": (4, 8), "w3": (8, 4)}.items():
            tensors[f"{MOE}.{e}.{w}.weight"] = ("I8", [out // 2, inp])
            for param in ("weight_scale", "weight_offset"):
                tensors[f"{MOE}.{e}.{w}.{param}"] = ("F32", [out, 1])
            tensors[f"{MOE}.{e}.{w}.scale_bias"] = ("F32", [out, 16 if w == "w2" else 1])
    tensors.update(odd)
    header, cursor = {}, 0
    for name, (dtype, shape) in tensors.items():
        end = cursor + math.prod(shape) * DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [cursor, end]}
        cursor = end
    return header, cursor


def test_a_w4a8_checkpoint_passes_as_vllm_ascend_reads_it_and_each_fault_is_named() -> None:
    layout = Layout(W4A8_CONFIG, W4A8_QUANT)
    assert layout.expert_count == 2 * 3 * 4
    header, data = w4a8_header()
    fast, slow = verdicts(layout, header, data)
    assert fast == 24 and slow == ([], 24)
    faults = {f"{MOE}.1.w2.scale_bias": (("F32", [4, 1]), "shape [4, 1], expected [4, 16]"),
              f"{MOE}.0.w1.weight": (("U8", [4, 4]), "dtype U8, expected I8 (two int4 values per byte)"),
              f"{MOE}.0.w3.weight_scale": (("BF16", [8, 1]), "dtype BF16, expected F32 (msModelSlim's"),
              f"{ATTN}.weight": (("BF16", [16, 16]), ("dtype BF16, expected I8 (quant_model_description.json: "
                                                      "W8A8_DYNAMIC)")),
              "language_model.lm_head.weight": (("I8", [32, 16]), "dtype I8, expected BF16")}
    for name, (odd, says) in faults.items():
        fast, slow = verdicts(layout, *w4a8_header(**{name: odd}))
        assert fast is None and not isinstance(slow, str) and slow[0][0].startswith(f"tensor {name}: {says}"), slow
    mxfp4 = Layout(W4A8_CONFIG)  # the same shard against the MXFP4 layout: every expert tensor refused
    assert verdicts(mxfp4, header, data)[0] is None


def write_single_file(root: Path, header: Header, data: int) -> None:
    raw = json.dumps(header).encode()
    root.mkdir()
    (root / shard_names.CONFIG_FILE).write_text(json.dumps(W4A8_CONFIG))
    (root / shard_names.SINGLE_FILE).write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data))


def test_the_structure_check_reads_the_quant_description_and_refuses_per_group_w4a8(tmp_path: Path) -> None:
    root = tmp_path / "w4a8"
    write_single_file(root, *w4a8_header())
    from k3deploy.catalog.loader import load_catalog
    from k3deploy.probes import shards
    from k3deploy.validate.stages.shards import QUANT_TYPES

    quant_type = QUANT_TYPES[load_catalog().model("kimi-k3-w4a8").weights.expert_format]
    missing = shards.main({"path": str(root), "hash": False, "workers": 1, "quant_type": quant_type})["problems"]
    assert missing[0]["file"] == shard_names.QUANT_FILE
    assert "missing: the W4A8_DYNAMIC checkpoint's per-tensor quantization" in missing[0]["message"]
    (root / shard_names.QUANT_FILE).write_text(json.dumps(W4A8_QUANT))
    assert shard_structure.structure(str(root), {}, workers=1, quant_type="W4A8_DYNAMIC") == []
    (root / shard_names.QUANT_FILE).write_text(json.dumps({**W4A8_QUANT, "group_size": 256}))
    grouped = shard_structure.structure(str(root), {}, workers=1, quant_type="W4A8_DYNAMIC")
    assert [p["message"] for p in grouped] == [(
        "quant_model_description.json: group_size 256: vLLM-Ascend's W4A8 MoE method takes per-channel weights "
        "only; use the per-channel W4A8 checkpoint (group_size 0)")]
