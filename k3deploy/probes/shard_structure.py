"""A checkpoint's structure from its headers, stdlib only: config against the catalog, every shard's header,
dtypes, shapes and byte spans, the index against the shards (shipped with the shard probe)."""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from k3deploy.probes.fast_json import Loads
from k3deploy.probes.shard_names import CONFIG_FILE, INDEX_FILE, MAX_LISTED, SINGLE_FILE, label, listed

HEADER_CAP = 256 << 20  # a header is a few MiB even for K3's largest shard; never read an absurd length
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "I16": 16,
              "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64}
SCALE_DTYPES = ("U8", "F8_E8M0")  # MXFP4 scales: E8M0 exponents, stored as either
EXPERTS = ".block_sparse_moe.experts."
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


class Layout:
    """The dtypes and shapes config.json implies: MXFP4 packed/scale pairs for routed experts, BF16 elsewhere."""

    def __init__(self, config: dict[str, Any]) -> None:
        t = config.get("text_config") or config
        self.layers, hidden, vocab = int(t["num_hidden_layers"]), int(t["hidden_size"]), int(t["vocab_size"])
        self.expert_shapes: dict[str, list[int]] = {}
        if "text_config" not in config:  # not K3's layout (a flat config: Llama, DeepSeek): BF16 tensors only
            self.experts, self.first_moe = 0, 0
            self.exact = {n: [vocab, hidden] for n in ("model.embed_tokens.weight", "lm_head.weight")}
            return
        group = int((config.get("quantization_config") or {}).get("group_size", 32))
        inter, latent = int(t["moe_intermediate_size"]), int(t["routed_expert_hidden_size"])
        self.experts, self.first_moe = int(t["num_experts"]), int(t.get("first_k_dense_replace", 0))
        # w1 = gate, w3 = up: latent -> inter; w2 = down: inter -> latent. Two E2M1 per byte, one scale per group.
        dims = {"w1": (inter, latent), "w2": (latent, inter), "w3": (inter, latent)}
        for w, (rows, cols) in dims.items():
            self.expert_shapes[f"{w}.weight_packed"] = [rows, cols // 2]
            self.expert_shapes[f"{w}.weight_scale"] = [rows, cols // group]
        self.exact = {n: [vocab, hidden] for n in ("language_model.model.embed_tokens.weight",
                                                    "language_model.lm_head.weight")}
        # What a sound routed-expert tensor looks like, for one set lookup each (~500k tensors in a full K3).
        self.expert_ids = frozenset(str(e) for e in range(self.experts))
        self.moe_layers = frozenset(str(layer) for layer in range(self.first_moe, self.layers))
        self.sound = {k: (("U8",) if k.endswith("packed") else SCALE_DTYPES, want)
                      for k, want in self.expert_shapes.items()}

    @property
    def expert_count(self) -> int:
        """Routed-expert tensors a complete checkpoint has."""
        return (self.layers - self.first_moe) * self.experts * len(self.expert_shapes)

    def check(self, name: str, dtype: str, shape: list[int]) -> str | None:
        """None when the tensor is what the config implies, else what is wrong ('' = not a routed expert)."""
        head, sep, tail = name.partition(EXPERTS)
        if not sep:
            if dtype != "BF16" and not name.startswith("vision"):
                return f"dtype {dtype}, expected BF16"
            want = self.exact.get(name)
            return f"shape {shape}, expected {want}" if want is not None and shape != want else None
        expert, _, kind = tail.partition(".")
        layer = head.rpartition(".")[2]
        sound = self.sound.get(kind)
        if sound is not None and expert in self.expert_ids and layer in self.moe_layers and dtype in sound[0] \
                and shape == sound[1]:
            return None
        if not (expert.isdigit() and int(expert) < self.experts and layer.isdigit()
                and self.first_moe <= int(layer) < self.layers and kind in self.expert_shapes):
            return "not a routed-expert tensor of this config"
        if kind.endswith("packed") and dtype != "U8":
            return f"dtype {dtype}, expected U8 (two E2M1 values per byte)"
        if not kind.endswith("packed") and dtype not in SCALE_DTYPES:
            return f"dtype {dtype}, expected U8 or F8_E8M0 (E8M0 scales)"
        want = self.expert_shapes[kind]
        return f"shape {shape}, expected {want}" if shape != want else None


def shard_problems(path: str, layout: Layout | None) -> tuple[list[str], int, int | None]:
    """What is wrong with one shard's header and length, its routed-expert tensor count, and the hash of its
    tensor names (None when the header is unreadable)."""
    try:
        n, header, size = read_header(path)
    except (OSError, ValueError) as exc:
        return [getattr(exc, "strerror", None) or str(exc)], 0, None
    header.pop("__metadata__", None)
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
    # Python's string hash is per process, but forked workers share the parent's: comparable with the index's.
    return out, experts, hash(frozenset(header))


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


def structure(root: str, expect: dict[str, Any], workers: int = 0, loads: Loads = json.loads) -> list[Problem]:
    """Index, config and every shard's header (parsed by `loads`): what is wrong, each with the file it is in."""
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
        _LAYOUT = Layout(config)
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
        by_shard: dict[str, list[str]] = {SINGLE_FILE: []} if single else {}
        for tensor, shard in weight_map.items():
            by_shard.setdefault(shard, []).append(tensor)
        results = dict(zip(on_disk, (fut.result() for fut in futures)))
    finally:
        if pool is not None:
            pool.shutdown()
    experts = 0
    for shard in sorted(by_shard):
        if shard not in results:
            add(shard, "missing (named by the index)")
            continue
        found, count, names = results[shard]
        experts += count
        for message in found:
            add(shard, message)
        if names is not None and names != hash(frozenset(by_shard[shard])):
            for message in name_problems(shard, os.path.join(root, shard), by_shard[shard]):
                add(shard, message)
    if _LAYOUT is not None and experts < _LAYOUT.expert_count and not problems:
        add(INDEX_FILE, f"{_LAYOUT.expert_count - experts:,} of {_LAYOUT.expert_count:,} routed-expert tensors "
            "are in no shard and not in the weight_map")
    return problems
