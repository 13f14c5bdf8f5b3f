"""Which rigs exist: one JSON file per rig naming its creator, and the sweep of dead rigs' leftovers."""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .netns import MGMT_NET, PRIV_NET, destroy, owned_links, owned_netns
from .procs import pid_alive, start_ticks

REGISTRY_DIR = Path("/tmp")
LOCK_PATH = REGISTRY_DIR / "k3rig.lock"


def registry_path(ident: str) -> Path:
    return REGISTRY_DIR / f"k3rig-{ident}.json"


@contextmanager
def registry_lock() -> Iterator[None]:
    """Serialise allocation and sweeping across processes (two pytest runs at once)."""
    with open(LOCK_PATH, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _records(prefix: str) -> dict[str, dict]:
    out = {}
    for path in REGISTRY_DIR.glob(f"k3rig-{prefix}*.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            rec = {}
        out[path.name[len("k3rig-") : -len(".json")]] = rec
    return out


def _creator_alive(rec: dict) -> bool:
    pid = rec.get("creator_pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    return start_ticks(pid) == rec.get("creator_start")


def _used_subnets() -> set[int]:
    """Third octets already on 10.231/16 or 10.232/16 in the root namespace."""
    run = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10, check=False
    )
    pattern = rf"inet (?:{re.escape(PRIV_NET)}|{re.escape(MGMT_NET)})\.(\d+)\."
    return {int(m) for m in re.findall(pattern, run.stdout)}


def _orphan_idents(prefix: str) -> set[str]:
    pattern = re.compile(rf"^({re.escape(prefix)}[0-9a-f]{{4}})")
    names = owned_netns(prefix) + owned_links(prefix)
    return {m.group(1) for m in map(pattern.match, names) if m}


def _remove(ident: str, rec: dict) -> list[str]:
    problems = destroy(ident)
    workdir = rec.get("workdir")
    if isinstance(workdir, str) and Path(workdir).name.startswith(f"k3rig-{ident}"):
        shutil.rmtree(workdir, ignore_errors=True)
    registry_path(ident).unlink(missing_ok=True)
    return problems


def cleanup_stale(prefix: str = "k3r") -> list[str]:
    """Remove leftovers of rigs whose creating process is dead; returns the idents removed."""
    removed = []
    with registry_lock():
        records = _records(prefix)
        for ident, rec in records.items():
            if not _creator_alive(rec):
                _remove(ident, rec)
                removed.append(ident)
        # Names without any record (record deleted by hand): nobody alive owns them,
        # since a rig writes its record under the lock before creating anything.
        for ident in _orphan_idents(prefix) - set(records):
            _remove(ident, {})
            removed.append(ident)
    return sorted(removed)


def allocate(prefix: str, workdir_parent: Path) -> tuple[str, int, Path]:
    """Reserve a fresh ident, a free subnet octet and a workdir, recorded before anything is built."""
    rng = random.SystemRandom()
    with registry_lock():
        records = _records(prefix)
        taken_ids = set(records) | _orphan_idents(prefix)
        used = _used_subnets() | {r.get("subnet") for r in records.values() if isinstance(r, dict)}
        free = [x for x in range(256) if x not in used]
        if not free:
            raise RuntimeError("no free 10.231.X.0/24 subnet for another rig")
        for _ in range(1000):
            ident = f"{prefix}{rng.randrange(16**4):04x}"
            if ident not in taken_ids:
                break
        else:
            raise RuntimeError("no free rig ident")
        subnet = rng.choice(free)
        workdir = Path(workdir_parent) / f"k3rig-{ident}"
        workdir.mkdir(mode=0o700)
        me = os.getpid()
        record = {
            "ident": ident,
            "subnet": subnet,
            "creator_pid": me,
            "creator_start": start_ticks(me),
            "workdir": str(workdir),
        }
        registry_path(ident).write_text(json.dumps(record))
    return ident, subnet, workdir


def release(ident: str, workdir: Path) -> list[str]:
    """Tear down one rig's network leftovers and forget it."""
    with registry_lock():
        return _remove(ident, {"workdir": str(workdir)})
