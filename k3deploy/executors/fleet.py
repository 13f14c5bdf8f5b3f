"""NodeFleet: every node of a deployment as one object. Connect all, map a function, run a script, run a
stdlib-only probe shipped by source; one outcome per rank, every failure named, bounded parallelism."""
from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from typing_extensions import Self

from k3deploy.errors import ExecError
from k3deploy.executors.base import CommandResult, Executor
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.target import ExecTarget
from k3deploy.probes.bundle import program

R = TypeVar("R")
MAX_PARALLEL = 32
# The probe's interpreter on the node: any python3 (probes use the standard library only).
NODE_PYTHON = "python3"
NO_PYTHON = 127


@dataclass(frozen=True)
class NodeOutcome(Generic[R]):
    """One node's result, or the exception that stood in its way."""

    rank: int
    host: str
    value: R | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        """No exception."""
        return self.error is None


class ProbeError(ExecError):
    """A probe could not run on a node, or did not end with a JSON result line."""


class NodeFleet:
    """The executors of a set of nodes (by rank), a bounded thread pool, and the per-node operations."""

    def __init__(self, targets: Mapping[int, ExecTarget], factory: ExecutorFactory = open_executor,
                 max_parallel: int = MAX_PARALLEL) -> None:
        self.targets = dict(sorted(targets.items()))
        # Executors are made (not connected) up front: an executor kind that cannot work here fails now.
        self._executors = {rank: factory(t) for rank, t in self.targets.items()}
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(self.targets))),
                                        thread_name_prefix="k3fleet")

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank, ascending."""
        return tuple(self.targets)

    def host(self, rank: int) -> str:
        """The host of a rank, as the topology names it."""
        return self.targets[rank].host

    def executor(self, rank: int) -> Executor:
        """The executor of one node."""
        return self._executors[rank]

    def map(self, fn: Callable[[int, Executor], R], ranks: Iterable[int] | None = None, *,
            in_pool: bool = False) -> dict[int, NodeOutcome[R]]:
        """`fn(rank, executor)` on every chosen node at once; never raises for a node. One node runs in the
        calling thread unless `in_pool` (then an interrupt of the caller never cuts `fn` short)."""
        chosen = list(self.ranks if ranks is None else ranks)

        def one(rank: int) -> NodeOutcome[R]:
            try:
                return NodeOutcome(rank, self.host(rank), fn(rank, self._executors[rank]))
            except Exception as exc:  # noqa: BLE001 - the caller decides what a node's failure means
                return NodeOutcome(rank, self.host(rank), error=exc)

        if len(chosen) == 1 and not in_pool:  # no thread hop for the common single-node call
            return {chosen[0]: one(chosen[0])}
        futures = [self._pool.submit(one, rank) for rank in chosen]
        return {f.result().rank: f.result() for f in futures}

    def connect_all(self, ranks: Iterable[int] | None = None) -> dict[int, NodeOutcome[None]]:
        """Connect to every chosen node at once."""
        return self.map(lambda _rank, ex: ex.connect(), ranks)

    def run_all(self, command: str | Sequence[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
                ranks: Iterable[int] | None = None) -> dict[int, NodeOutcome[CommandResult]]:
        """The same command on every chosen node."""
        return self.map(lambda _rank, ex: ex.run(command, timeout_s, env=env), ranks)

    def run_probe(self, module: types.ModuleType | str | Path, args: Sequence[str] = (), *, timeout_s: float = 60.0,
                  args_for: Callable[[int], Sequence[str]] | None = None, ranks: Iterable[int] | None = None,
                  env: Mapping[str, str] | None = None,
                  on_line: Callable[[int, str], None] | None = None) -> dict[int, NodeOutcome[Any]]:
        """Ship a stdlib-only module by source to `python3 -c` on every chosen node (nothing of k3deploy
        needs to be installed there); each node's value is the JSON of the last line it prints. Earlier
        stdout lines (progress) reach `on_line(rank, line)` as they come."""
        source = probe_source(module)

        def one(rank: int, ex: Executor) -> Any:
            argv = [NODE_PYTHON, "-c", source, *args, *(args_for(rank) if args_for else ())]
            sink = (lambda line: on_line(rank, line)) if on_line is not None else None
            return parse_probe_output(ex.run(argv, timeout_s, env=env, on_line=sink), ex.host)

        return self.map(one, ranks)

    def close(self) -> None:
        """Close every executor (errors while closing do not matter) and free the threads."""
        for ex in self._executors.values():
            try:
                ex.close()
            except ExecError:
                pass
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def require_all(outcomes: Mapping[int, NodeOutcome[R]]) -> dict[int, R | None]:
    """Every value, or one ExecError naming the first failed node (rank order) and listing the others."""
    failed = [o for _, o in sorted(outcomes.items()) if not o.ok]
    if not failed:
        return {rank: o.value for rank, o in outcomes.items()}
    first = failed[0]
    others = ", ".join(o.host for o in failed[1:])
    also = f" (also failed: {others})" if others else ""
    if isinstance(first.error, ExecError):
        text = str(first.error).removeprefix(f"{first.error.host}: ")
        raise ExecError(text + also, host=first.error.host or first.host, hint=first.error.hint)
    raise ExecError(f"{first.error}{also}", host=first.host)


@functools.cache
def _source_of(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def probe_source(module: types.ModuleType | str | Path) -> str:
    """A probe's program for `python3 -c`: a module with the probe modules it ships with, or a file's source
    (each file read once per process)."""
    if isinstance(module, types.ModuleType):
        return program(module)
    return _source_of(str(module))


def parse_probe_output(res: CommandResult, host: str) -> Any:
    """The JSON of a probe's last stdout line; ProbeError naming the host when there is none."""
    if res.exit_code == NO_PYTHON:
        raise ProbeError("python3 is not on the node's PATH (k3deploy's node checks need any python3; "
                         "nothing else)", host=host, hint="install python3 on the node")
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    if res.exit_code != 0 or not lines:
        tail = (res.stderr.strip() or res.stdout.strip())[-500:]
        raise ProbeError(f"probe failed (exit {res.exit_code}): {tail or 'no output'}", host=host)
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise ProbeError(f"probe printed no JSON result: {lines[-1][:200]!r}", host=host) from None
