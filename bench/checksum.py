"""Checkpoint hashing and header checks, in one run over the same files:

1. sha256 of N equal files (warm in the page cache): k3deploy's probe (`sha256_files`, one thread per core,
   large readinto buffers) against one hashlib thread (the same 8 MiB readinto loop, one file after another)
   and against coreutils `sha256sum` over the same files. Targets: >= 1.8x the single thread on a 2-core
   machine (the limit is 2x), >= 8x sha256sum.
2. The structural check of a full-scale sparse K3 checkpoint (96 shards, every real tensor header; holes
   for payloads) through the probe as a node runs it (`python3 -c SOURCE SPEC`), once with each JSON parser
   this interpreter has (msgspec, the standard library's json): wall and CPU seconds, beside each
   parser's floor (reading and parsing the same headers and index, checking nothing). Target: under 1 s.

Usage: python bench/checksum.py [--files 4] [--mib 256] [--runs 3] [--skip-sparse]
Runs are interleaved (A, B, C, A, B, C, ...) so a busy machine slows all three alike; the best run of each
counts. Files and the sparse checkpoint live in a temporary directory removed at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from k3deploy.probes import shard_inventory, shards
from k3deploy.probes.bundle import program

BUFFER = 8 << 20

# The floor of the structural check: only read and parse every shard header (in as many processes as there
# are cores, like the probe) and the index, checking nothing: one parser's own minimum. {loads} is the parser.
PARSE_FLOOR = r"""
import json, os, struct, sys
from concurrent.futures import ProcessPoolExecutor
{imports}
def header(path):
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        return len({loads}(fh.read(n)))
root = sys.argv[1]
shards = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".safetensors"))
with ProcessPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
    tensors = sum(pool.map(header, shards))
with open(os.path.join(root, "model.safetensors.index.json"), "rb") as fh:
    names = len({loads}(fh.read())["weight_map"])
print(tensors, names)
"""
FLOOR_PARSERS = {"json": ("", "json.loads"), "orjson": ("import orjson", "orjson.loads"),
                 "msgspec": ("import msgspec.json", "msgspec.json.decode")}


def one_thread(paths: list[str]) -> dict[str, str]:
    """The baseline: one hashlib thread, 8 MiB readinto, one file after another."""
    out = {}
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    for path in paths:
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while got := f.readinto(buf):
                h.update(view[:got])
        out[path] = h.hexdigest()
    return out


def probe(paths: list[str]) -> dict[str, str]:
    """k3deploy: the node probe's threaded hashing."""
    return {p: sha for p, (_, sha) in shard_inventory.sha256_files(paths).items()}


def sha256sum(paths: list[str]) -> dict[str, str]:
    """coreutils sha256sum over the same files."""
    done = subprocess.run(["sha256sum", *paths], capture_output=True, text=True, check=True)
    return {line.split("  ", 1)[1]: line.split()[0] for line in done.stdout.splitlines()}


def _cpu_s() -> float:
    """CPU seconds of this process (all threads) and its reaped children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[list[str]], dict[str, str]], paths: list[str]) -> tuple[float, float, dict[str, str]]:
    """(wall s, CPU s, digests) of one run."""
    cpu, start = _cpu_s(), time.perf_counter()
    digests = fn(paths)
    return time.perf_counter() - start, _cpu_s() - cpu, digests


def hashing(tmp: Path, files: int, mib: int, runs: int) -> dict[str, float]:
    paths = []
    for i in range(files):
        path = tmp / f"shard-{i}.bin"
        with path.open("wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        paths.append(str(path))
    one_thread(paths)  # warm the page cache
    best = {"k3deploy": float("inf"), "hashlib-1-thread": float("inf"), "sha256sum": float("inf")}
    cpu: dict[str, float] = {}
    reference: dict[str, str] | None = None
    for _ in range(runs):
        for name, fn in (("k3deploy", probe), ("hashlib-1-thread", one_thread), ("sha256sum", sha256sum)):
            seconds, cpu_s, digests = timed(fn, paths)
            reference = reference or digests
            assert digests == reference, f"{name} disagrees"  # all three must compute the same digests
            if seconds < best[name]:
                best[name], cpu[name] = seconds, cpu_s
    gb = files * mib * (1 << 20) / 1e9
    for name, seconds in best.items():
        # CPU/wall is the parallelism a method got: about 2 for k3deploy on 2 idle cores, 1 for the others.
        print(f"  {name:18s} {seconds:7.3f} s  {gb / seconds:6.2f} GB/s  cpu/wall {cpu[name] / seconds:4.2f}")
    ratios = {"vs_one_thread": best["hashlib-1-thread"] / best["k3deploy"],
              "vs_sha256sum": best["sha256sum"] / best["k3deploy"]}
    print(f"  k3deploy: {ratios['vs_one_thread']:.2f}x one hashlib thread (target >= 1.8 on 2 cores), "
          f"{ratios['vs_sha256sum']:.1f}x sha256sum (target >= 8)")
    return {**{f"{k}_s": v for k, v in best.items()}, **ratios, "gb": gb}


def sparse(tmp: Path, runs: int) -> dict[str, float]:
    """The structural check with each JSON parser this interpreter has, beside each parser's parse floor."""
    import importlib.util

    from k3deploy.catalog.loader import load_catalog
    from k3deploy.probes.fast_json import PARSERS
    from k3deploy.sim.sparse_checkpoint import write_sparse_checkpoint
    from k3deploy.validate.stages.shards import config_expectations

    model = load_catalog().model("kimi-k3")
    path = tmp / "k3-sparse"
    total = write_sparse_checkpoint(path, model.architecture.model_dump())
    parsers = [p for p in PARSERS if p == "json" or importlib.util.find_spec(p) is not None]
    floors_only = [p for p in FLOOR_PARSERS if p not in parsers and importlib.util.find_spec(p) is not None]
    best: dict[str, list[float]] = {}
    for _ in range(runs):  # interleaved: each parser's check, then its parse-only floor
        for name in parsers:
            spec = json.dumps({"path": str(path), "expect": config_expectations(model), "hash": False,
                               "json_parser": name})
            wall, cpu, out = _child([sys.executable, "-c", program(shards), spec])
            result = json.loads(out.splitlines()[-1])
            assert result["problems"] == [] and result["json_parser"] == name, result["problems"][:3]
            imports, loads = FLOOR_PARSERS[name]
            fwall, fcpu, _ = _child([sys.executable, "-c", PARSE_FLOOR.format(imports=imports, loads=loads),
                                     str(path)])
            old = best.get(name, [float("inf")] * 4)
            best[name] = [min(old[0], wall), min(old[1], cpu), min(old[2], fwall), min(old[3], fcpu)]
        for name in floors_only:  # a parser the probe does not use (see probes/fast_json.py): its floor only
            imports, loads = FLOOR_PARSERS[name]
            fwall, fcpu, _ = _child([sys.executable, "-c", PARSE_FLOOR.format(imports=imports, loads=loads),
                                     str(path)])
            old = best.get(name, [float("nan"), float("nan"), float("inf"), float("inf")])
            best[name] = [old[0], old[1], min(old[2], fwall), min(old[3], fcpu)]
    cores = os.cpu_count() or 1
    print(f"  96 shards, {total:,} payload bytes, {cores} cores (target < 1 s wall):")
    out: dict[str, float] = {}
    for name, (wall, cpu, fwall, fcpu) in best.items():
        if name in floors_only:
            print(f"  {name:8} (not used by the probe) floor {fwall:.2f} s wall, {fcpu:.2f} s CPU")
            out |= {f"{name}_floor_wall_s": fwall, f"{name}_floor_cpu_s": fcpu}
            continue
        print(f"  {name:8} structure {wall:.2f} s wall, {cpu:.2f} s CPU; floor (read + parse every header and "
              f"the index, no checks) {fwall:.2f} s wall, {fcpu:.2f} s CPU; structure / floor = {wall / fwall:.2f}x")
        out |= {f"{name}_structure_wall_s": wall, f"{name}_structure_cpu_s": cpu,
                f"{name}_floor_wall_s": fwall, f"{name}_floor_cpu_s": fcpu}
    if "json" in best and len(best) > 1:
        fastest = min(parsers, key=lambda n: best[n][0])
        print(f"  fastest here: {fastest}, standard json / {fastest} = {best['json'][0] / best[fastest][0]:.2f}x wall")
    return out


def _child(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child and its children, stdout) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-sparse", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="k3-checksum-"))
    try:
        print(f"sha256 of {args.files} x {args.mib} MiB (warm), best of {args.runs}, {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}:")
        result = hashing(tmp, args.files, args.mib, args.runs)
        if not args.skip_sparse:
            print("full-scale sparse K3 checkpoint, headers only:")
            result |= sparse(tmp, args.runs)
        print(json.dumps({k: round(v, 3) for k, v in result.items()}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
