"""The structural check's bulk pass over a shard header (shard_layout.Layout.sound_experts) against the
per-tensor check that names faults (shard_structure.tensor_problems): the bulk pass may decline anything, but
whatever it passes the per-tensor check passes too, with the same routed-expert count."""
from __future__ import annotations

import copy
import gc
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3deploy.probes import shard_names, shard_structure
from k3deploy.probes.shard_layout import Layout
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
