"""Checkpoint probe, stdlib only: safetensors structure from headers, then sha256 of every file in threads.

Run on a node as `python3 -c PROGRAM SPEC_JSON`, PROGRAM being this module with the probe modules it names in
SHIPS_WITH (`k3deploy.probes.bundle.program`). SPEC_JSON: {"path", "expect": {dotted config key: value},
"quant_type": msModelSlim's model_quant_type the checkpoint must have | null, "files": {name: [size, sha256]} | null, "hash": bool, "threads": int (0 = all cores), "progress_s": float,
"json_parser": "orjson" | "msgspec" | "json" | null (null: the fastest present)}.
Prints JSON lines: {"type": "progress", ...} while hashing, then one {"type": "result", ...} line last.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from k3deploy.probes import fast_json
from k3deploy.probes.shard_inventory import local_files, revision_hint, sha256_files
from k3deploy.probes.shard_structure import structure

# Whole-checkpoint hashing is disk-bound; budget this rate before calling a node hung.
MIN_HASH_BYTES_PER_S = 100_000_000  # read by validate's shards stage and `weights`, not on the node

SHIPS_WITH = ("fast_json", "shard_names", "shard_inventory", "shard_layout", "shard_structure")


def main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the checks the spec asks for and return the result line's content."""
    root = spec["path"]
    if not os.path.isdir(root):
        return {"type": "result", "path": root, "fatal": f"{root}: no such directory", "problems": []}
    try:
        parser, loads = fast_json.parser(spec.get("json_parser"))
    except ValueError as exc:
        return {"type": "result", "path": root, "fatal": str(exc), "problems": []}
    t0 = time.monotonic()
    problems = structure(root, spec.get("expect") or {}, int(spec.get("workers", 0)), loads, spec.get("quant_type"))
    structure_s = time.monotonic() - t0
    revision, revision_from = revision_hint(root)
    files: dict[str, Any] = {}
    wanted = spec.get("files")
    names = sorted(wanted) if wanted is not None else local_files(root)
    if spec.get("hash", True):
        def progress(done: int, total: int, files_done: int) -> None:
            line = {"type": "progress", "phase": "sha256", "done": done, "total": total, "files_done": files_done,
                    "files": len(names), "elapsed_s": round(time.monotonic() - t1, 3)}
            print(json.dumps(line), flush=True)

        t1 = time.monotonic()
        digests = sha256_files([os.path.join(root, n) for n in names], int(spec.get("threads", 0)), progress,
                               float(spec.get("progress_s", 1.0)))
        files = {n: list(digests[os.path.join(root, n)]) for n in names if os.path.join(root, n) in digests}
        hash_s = time.monotonic() - t1
    else:
        hash_s = 0.0
    return {"type": "result", "path": root, "revision": revision, "revision_from": revision_from,
            "files": files, "missing": [n for n in names if n not in files] if spec.get("hash", True) else [],
            "problems": problems, "structure_s": round(structure_s, 3), "hash_s": round(hash_s, 3),
            "hashed_bytes": sum(v[0] for v in files.values()), "json_parser": parser}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
