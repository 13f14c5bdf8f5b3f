"""A checkpoint's structure from its headers, stdlib only: config against the catalog, every shard's header,
dtypes, shapes and byte spans, the index against the shards (shipped with the shard probe)."""
from __future__ import annotations

import gc
import json
import math
import multiprocessing
import os
import struct
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from operator import mul
from typing import Any

from k3deploy.probes.fast_json import Loads
from k3deploy.probes.shard_layout import DTYPE_BITS, EXPERTS, Layout
from k3deploy.probes.shard_names import (
    CONFIG_FILE,
    INDEX_FILE,
    MAX_LISTED,
    QUANT_FILE,
    SINGLE_FILE,
    label,
    listed,
)

HEADER_CAP = 256 << 20  # a header is a few MiB even for K3's largest shard; never read an absurd length
MAX_WORKERS = 32  # header-parsing processes; a 200-core node gains nothing from more for ~100 shards

Problem = dict[str, str]


def read_header(path: str, cap: int = HEADER_CAP) -> tuple[int, dict[str, Any], int]:
    """(header length N, parsed header, file size); ValueError says what is wrong."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ValueError(f"{size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > cap:
            raise ValueError(f"header length {n:,} exceeds the {cap:,}-byte cap (not a safetensors file?)")
        if 8 + n > size:
            raise ValueError(f"header of {n:,} bytes runs past the end of the {size:,}-byte file")
        raw = f.read(n)
    try:
        header = _LOADS(raw)
    except ValueError as exc:
        raise ValueError(f"header is not JSON ({exc})") from None
    if not raw.startswith(b"{") or not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return n, header, size


def config_problems(config: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """Dotted config keys whose value is not the catalog's."""
    out = []
    for key, want in sorted(expect.items()):
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != want:
            out.append(f"{key} is {json.dumps(node)}, the catalog says {json.dumps(want)}")
    return out


def shard_problems(path: str, layout: Layout | None) -> tuple[list[str], int, int | None]:
    """What is wrong with one shard's header and length, its routed-expert tensor count, and the fingerprint of
    its tensor names (None when the header is unreadable)."""
    try:
        n, header, size = read_header(path)
    except (OSError, ValueError) as exc:
        return [getattr(exc, "strerror", None) or str(exc)], 0, None
    header.pop("__metadata__", None)
    names = fingerprint(header)
    experts = layout.sound_experts(header, size - 8 - n) if layout is not None else None
    if experts is not None:  # sound as a whole: nothing for the per-tensor check to name
        return [], experts, names
    return (*tensor_problems(header, n, size, layout), names)


def fingerprint(names: Iterable[str]) -> int:
    """An order-free fingerprint of tensor names: the sum of their hashes (a dict's keys carry theirs), exact,
    so shards' fingerprints add up (see _names_agree). Python's string hash is per process, but forked workers
    share the parent's."""
    return sum(map(hash, names))


def tensor_problems(header: dict[str, Any], n: int, size: int, layout: Layout | None) -> tuple[list[str], int]:
    """Each tensor's problems, then the tiling of the data, and the sound routed-expert count: tensor by tensor,
    to name what the bulk check refused."""
    out: list[str] = []
    spans = []
    bad_layout: list[str] = []
    experts = 0
    for tensor, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            nbytes = math.prod(shape) * DTYPE_BITS[dtype] // 8
        except (KeyError, TypeError, ValueError):
            out.append(f"tensor {tensor}: malformed entry {json.dumps(info)[:120]}")
            continue
        if end - begin != nbytes:
            out.append(f"tensor {tensor}: data_offsets span {end - begin:,} bytes, {dtype} {shape} needs {nbytes:,}")
        spans.append((begin, end, tensor))
        if layout is not None:
            wrong = layout.check(tensor, dtype, shape)
            if wrong:
                bad_layout.append(f"tensor {tensor}: {wrong}")
            elif EXPERTS in tensor:
                experts += 1
    out += bad_layout[:MAX_LISTED]
    if len(bad_layout) > MAX_LISTED:
        out.append(f"and {len(bad_layout) - MAX_LISTED:,} more tensors of the wrong dtype or shape")
    spans.sort()
    cursor = 0
    for begin, end, tensor in spans:
        if begin > cursor:
            out.append(f"hole of {begin - cursor:,} bytes before tensor {tensor}")
        elif begin < cursor:
            out.append(f"tensor {tensor} overlaps the tensor before it by {cursor - begin:,} bytes")
        cursor = max(cursor, end)
    want = 8 + n + cursor
    if size < want:
        out.append(f"{want - size:,} bytes short (file {size:,}, header says {want:,})")
    elif size > want:
        out.append(f"{size - want:,} bytes of trailing data after the last tensor")
    return out, experts


def name_problems(shard: str, path: str, indexed: list[str]) -> list[str]:
    """Tensors the index puts in this shard that it lacks, and tensors it has that the index does not name."""
    header = read_header(path)[1]
    header.pop("__metadata__", None)
    out = []
    absent = [t for t in indexed if t not in header]
    if absent:
        out.append(f"tensor {listed(absent)} missing from {label(shard)}")
    extra = sorted(set(header) - set(indexed))
    if extra:
        out.append(f"tensor {listed(extra)} in {label(shard)} but not in the index's weight_map")
    return out


# Both set before the worker processes fork, so they inherit them.
_LAYOUT: Layout | None = None
_LOADS: Loads = json.loads


def _shard_job(path: str) -> tuple[list[str], int, int | None]:
    return shard_problems(path, _LAYOUT)


def _map_shards(paths: list[str], workers: int) -> Any:
    """shard_problems over every shard: in forked processes across the node's cores (headers of a full K3
    are ~130 MB of JSON), serially where fork is not available."""
    workers = min(workers, len(paths), MAX_WORKERS)
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        return pool, [pool.submit(_shard_job, p) for p in paths]
    return None, [_Done(_shard_job(p)) for p in paths]


class _Done:
    """An already-computed result with a future's result()."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def is_single_file(root: str) -> bool:
    """The single-file form: one model.safetensors and no index (the engines load it as it is)."""
    return not os.path.exists(os.path.join(root, INDEX_FILE)) and os.path.isfile(os.path.join(root, SINGLE_FILE))


def read_weight_map(root: str, loads: Loads = json.loads) -> dict[str, str]:
    """Tensor -> file: the index's weight_map, or every tensor of the single file's header."""
    if is_single_file(root):
        header = read_header(os.path.join(root, SINGLE_FILE))[1]
        header.pop("__metadata__", None)
        return dict.fromkeys(header, SINGLE_FILE)
    with open(os.path.join(root, INDEX_FILE), "rb") as f:
        return dict(loads(f.read())["weight_map"])


def _names_agree(weight_map: dict[str, str], results: dict[str, Any], single: bool) -> bool:
    """Whether every shard the index names was read and holds exactly the tensors the index puts in it, without
    grouping ~500k names by shard: each tensor's hash weighted by its shard's, summed over the weight_map,
    against the shards' fingerprints weighted alike. Exact integers: a tensor missing, extra or in another
    shard changes the sum by a product of hash differences (sums of tuple hashes cancel on a swap)."""
    try:
        named = set(weight_map.values()) | ({SINGLE_FILE} if single else set())
        if not named <= results.keys() or any(results[s][2] is None for s in named):
            return False
        weight = {s: hash(s) for s in named}
        indexed = sum(map(mul, map(hash, weight_map), map(weight.__getitem__, weight_map.values())))
        return indexed == sum(weight[s] * results[s][2] for s in named)
    except TypeError:  # a shard name that is not a string: the grouping below names what is wrong
        return False


def _group(weight_map: dict[str, str], single: bool) -> dict[str, list[str]]:
    """Shard -> the tensors the index puts in it (the single file: whatever its header holds)."""
    by_shard: dict[str, list[str]] = {SINGLE_FILE: []} if single else {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(tensor)
    return by_shard


def structure(root: str, expect: dict[str, Any], workers: int = 0, loads: Loads = json.loads,
              quant_type: str | None = None) -> list[Problem]:
    """Index, config, the quant description (`quant_type`: the model_quant_type the catalog's checkpoint has) and
    every shard's header (parsed by `loads`): what is wrong, each with the file it is in."""
    # Headers are trees, freed by reference counting: the cyclic collector's passes over their ~1.5M containers
    # found nothing and cost a third of the parse. Forked workers inherit the setting.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _structure(root, expect, workers, loads, quant_type)
    finally:
        if enabled:
            gc.enable()


def quant_description(root: str, quant_type: str | None, loads: Loads) -> tuple[dict[str, Any] | None, list[str]]:
    """msModelSlim's quant_model_description.json (None where there is none) and what is wrong with it."""
    path = os.path.join(root, QUANT_FILE)
    if not os.path.exists(path):
        if quant_type is None:
            return None, []
        return None, [(f"missing: the {quant_type} checkpoint's per-tensor quantization, which vLLM-Ascend's "
                       "--quantization ascend reads; copy it from the checkpoint's download")]
    with open(path, "rb") as f:
        quant = loads(f.read())
    if not isinstance(quant, dict):
        return None, ["not a JSON object"]
    problems = []
    declared = quant.get("model_quant_type")
    if quant_type is not None and declared is not None and declared != quant_type:
        problems.append(f"model_quant_type {declared}, the catalog's checkpoint is {quant_type}")
    group = quant.get("group_size", 0)
    if isinstance(group, int) and group > 0 and "W4A8" in str(declared or quant_type or ""):
        # vllm_ascend/quantization/methods/w4a8.py refuses it at start: "Per-Group quantization, which is no
        # longer supported. Please switch to Per-Channel quantized weights."
        problems.append(f"group_size {group}: vLLM-Ascend's W4A8 MoE method takes per-channel weights only; "
                        "use the per-channel W4A8 checkpoint (group_size 0)")
    return quant, problems


def _structure(root: str, expect: dict[str, Any], workers: int, loads: Loads,
               quant_type: str | None = None) -> list[Problem]:
    global _LAYOUT, _LOADS
    problems: list[Problem] = []

    def add(file: str, message: str) -> None:
        problems.append({"file": file, "message": f"{label(file)}: {message}"})

    _LAYOUT, _LOADS = None, loads
    try:
        with open(os.path.join(root, CONFIG_FILE), "rb") as f:
            config = loads(f.read())
        for message in config_problems(config, expect):
            add(CONFIG_FILE, message)
        try:
            quant, wrong = quant_description(root, quant_type, loads)
        except (OSError, ValueError) as exc:
            quant, wrong = None, [f"cannot read it: {exc}"]
        for message in wrong:
            add(QUANT_FILE, message)
        _LAYOUT = Layout(config, quant)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        add(CONFIG_FILE, f"cannot derive the tensor layout: {type(exc).__name__}: {exc}")
    on_disk = sorted(f for f in os.listdir(root) if f.endswith(".safetensors"))
    # Workers start on the headers while this process parses the index.
    pool, futures = _map_shards([os.path.join(root, f) for f in on_disk], workers or os.cpu_count() or 1)
    try:
        single = is_single_file(root)
        try:
            weight_map = read_weight_map(root, loads)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if not single:
                add(INDEX_FILE, f"cannot read the weight map: {exc}")
                return problems
            weight_map = {}  # the file's own check below says what is wrong with its header
        results = dict(zip(on_disk, (fut.result() for fut in futures)))
    finally:
        if pool is not None:
            pool.shutdown()
    by_shard = None if _names_agree(weight_map, results, single) else _group(weight_map, single)
    named = by_shard.keys() if by_shard is not None else set(weight_map.values()) | ({SINGLE_FILE} if single else set())
    experts = 0
    for shard in sorted(named):
        if shard not in results:
            add(shard, "missing (named by the index)")
            continue
        found, count, names = results[shard]
        experts += count
        for message in found:
            add(shard, message)
        if by_shard is not None and names is not None and names != fingerprint(by_shard[shard]):
            for message in name_problems(shard, os.path.join(root, shard), by_shard[shard]):
                add(shard, message)
    if _LAYOUT is not None and experts < _LAYOUT.expert_count and not problems:
        add(INDEX_FILE, f"{_LAYOUT.expert_count - experts:,} of {_LAYOUT.expert_count:,} routed-expert tensors "
            "are in no shard and not in the weight_map")
    return problems
