"""Validation test helpers: per-node checkpoint copies with seeded faults, a local probe runner in which each
"node" sees its own copy at the topology's checkpoint path, and a topology for them."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from k3deploy.errors import ExecError
from k3deploy.executors.local import LocalExecutor
from k3deploy.sim.checkpoint import write_checkpoint

# Node -> (fault, revision): what tests seed, one fault per node; the rest are clean copies of tiny-r1.
FAULTS: dict[str, tuple[str | None, str]] = {
    "truncate": ("truncate", "tiny-r1"), "flip": ("flip", "tiny-r1"), "missing-tensor": ("missing-tensor", "tiny-r1"),
    "wrong-dtype": ("wrong-dtype", "tiny-r1"), "revision": (None, "tiny-r2"), "clean": (None, "tiny-r1")}
FAULT_SHARD = 3  # faults land in shard 00003 of 4


def write_nodes(base: Path, kinds: Sequence[str]) -> dict[int, Path]:
    """One checkpoint directory per rank, rank r seeded with FAULTS[kinds[r]]."""
    roots = {}
    for rank, kind in enumerate(kinds):
        fault, revision = FAULTS[kind]
        roots[rank] = base / f"node{rank}"
        write_checkpoint(roots[rank], revision=revision, corrupt=fault, corrupt_shard=FAULT_SHARD)  # type: ignore[arg-type]
    return roots


@dataclass(frozen=True)
class LocalOutcome:
    """A rank's probe answer, shaped like NodeFleet's Outcome."""

    value: Any
    error: Exception | None

    @property
    def ok(self) -> bool:
        return self.error is None


class LocalNodes:
    """Runs the probe as real subprocesses, one per rank, where the topology's checkpoint path is replaced by that
    rank's directory (on a real fleet every node has its own disk at the same path); records each call."""

    def __init__(self, roots: Mapping[int, Path], checkpoint_path: str, dead: Sequence[int] = ()) -> None:
        self.roots, self.checkpoint_path, self.dead = dict(roots), checkpoint_path, set(dead)
        self.calls: list[tuple[Sequence[str], float]] = []
        self.lines: list[tuple[int, str]] = []

    def executor(self, rank: int) -> LocalExecutor:
        """Each rank is this machine."""
        return LocalExecutor(f"node{rank}")

    def run_probe(self, module: ModuleType, args: Sequence[str], *, timeout_s: float,
                 on_line: Callable[[int, str], None] | None = None) -> dict[int, LocalOutcome]:
        self.calls.append((args, timeout_s))
        source = Path(str(module.__file__)).read_text(encoding="utf-8")
        out: dict[int, LocalOutcome] = {}
        threads = [threading.Thread(target=self._one, args=(rank, source, args, timeout_s, on_line, out))
                   for rank in self.roots]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 5)
        return out

    def _one(self, rank: int, source: str, args: Sequence[str], timeout_s: float,
             on_line: Callable[[int, str], None] | None, out: dict[int, LocalOutcome]) -> None:
        if rank in self.dead:
            out[rank] = LocalOutcome(None, ExecError("connection refused", host=f"node{rank}"))
            return
        mine = [a.replace(self.checkpoint_path, str(self.roots[rank])) for a in args]
        proc = subprocess.run([sys.executable, "-c", source, *mine], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        lines = proc.stdout.splitlines()
        for line in lines[:-1]:
            self.lines.append((rank, line))
            if on_line is not None:
                on_line(rank, line)
        if proc.returncode != 0 or not lines:
            out[rank] = LocalOutcome(None, ExecError(f"probe exit {proc.returncode}: {proc.stderr[-300:]}",
                                                     host=f"node{rank}"))
        else:
            out[rank] = LocalOutcome(json.loads(lines[-1]), None)

    def factory(self) -> Callable[[Any, Any], contextlib.AbstractContextManager[LocalNodes]]:
        """A RunnerFactory yielding these nodes."""
        @contextlib.contextmanager
        def opened(topology: Any, deployment: Any) -> Iterator[LocalNodes]:
            yield self
        return opened


def topology_file(tmp: Path, name: str, nodes: int, checkpoint_path: str, **validate: Any) -> Path:
    """A kimi-k3-tiny topology over `nodes` hosts named node0..; nothing is launched from it."""
    doc = {"name": name, "model": {"id": "kimi-k3-tiny", "path": checkpoint_path},
           "hardware": {"gpu": "sim", "gpus_per_node": 1},
           "nodes": [{"host": f"node{i}", "ip": f"10.9.0.{i + 1}", "iface": "eth0"} for i in range(nodes)],
           "engine": {"kind": "sim", "mimic": "sglang"}, "parallel": {"tp": nodes, "ep": nodes},
           "launch": {"executor": "local", "state_dir": str(tmp / "state")}, "validate": validate}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
