"""A checkpoint's content, stdlib only: its files, their sha256 in threads, the revision the copy claims (shipped
with the shard probe; `k3deploy manifest` runs it on the host)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable

from k3deploy.probes.shard_names import MANIFEST_FILE

READ_BUFFER = 8 << 20


def local_files(root: str) -> list[str]:
    """Every regular file under root (relative, sorted), without dot-directories and our manifest."""
    out = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(base, root)
        out += [f if rel == "." else f"{rel}/{f}" for f in files if f != MANIFEST_FILE and not f.startswith(".")]
    return sorted(out)


def sha256_files(paths: list[str], threads: int = 0, progress: Callable[[int, int, int], None] | None = None,
                 progress_s: float = 1.0) -> dict[str, tuple[int, str]]:
    """{path: (size, sha256)} with one file per thread (hashlib releases the GIL); unreadable files omitted."""
    sizes = {}
    for p in paths:
        try:
            sizes[p] = os.stat(p).st_size
        except OSError:
            pass
    queue = sorted(sizes, key=lambda p: -sizes[p])  # largest first: the last file to start is a small one
    total, out = sum(sizes.values()), {}
    lock = threading.Lock()
    done = [0] * max(1, threads or os.cpu_count() or 1)  # bytes hashed, one counter per thread (no shared +=)

    def work(slot: int) -> None:
        buf = bytearray(READ_BUFFER)
        view = memoryview(buf)
        while True:
            with lock:
                if not queue:
                    return
                path = queue.pop(0)
            h, size = hashlib.sha256(), 0
            try:
                with open(path, "rb", buffering=0) as f:
                    for _ in range(1 << 40):
                        got = f.readinto(buf)
                        if not got:
                            break
                        h.update(view[:got])
                        size += got
                        done[slot] += got
            except OSError:
                continue
            out[path] = (size, h.hexdigest())

    count = max(1, min(len(done), len(queue)))
    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        while w.is_alive():
            w.join(progress_s)
            if w.is_alive() and progress is not None:
                progress(sum(done), total, len(out))
    if progress is not None:  # always a last tick once every thread is done: it says the whole total
        progress(sum(done), total, len(out))
    return out


def revision_hint(root: str) -> tuple[str | None, str]:
    """The revision this copy claims: our manifest, huggingface's download metadata, or a snapshots/<sha> path."""
    try:
        with open(os.path.join(root, MANIFEST_FILE), "rb") as f:
            return str(json.load(f)["revision"]), MANIFEST_FILE
    except (OSError, ValueError, KeyError, TypeError):
        pass
    meta = os.path.join(root, ".cache", "huggingface", "download")
    commits = set()
    for base, _, names in os.walk(meta):
        for name in names:
            if name.endswith(".metadata"):
                try:
                    with open(os.path.join(base, name)) as fh:
                        commits.add(fh.readline().strip())
                except OSError:
                    pass
    if len(commits) == 1:
        return commits.pop(), ".cache/huggingface/download"
    m = re.search(r"/snapshots/([0-9a-f]{40})(/|$)", os.path.abspath(root))
    return (m.group(1), "hub cache snapshot path") if m else (None, "")
