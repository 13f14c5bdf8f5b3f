"""Every node of a topology as a ProbeRunner: the probe's source to `python3 -c` on each node at once."""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from k3deploy.errors import ExecError

if TYPE_CHECKING:
    from k3deploy.executors.base import Executor
    from k3deploy.launch.state import Deployment
    from k3deploy.topology.schema import Topology
    from k3deploy.validate.stage import ProbeOutcome


@contextlib.contextmanager
def executor_runner(topology: Topology, deployment: Deployment | None) -> Iterator[Any]:
    """Probe runner over the topology's executors (one connection per node, reused, closed at the end)."""
    from k3deploy.executors.fanout import FanOut
    from k3deploy.executors.target import open_executor, targets_for

    targets = targets_for(topology)
    executors: dict[int, Executor] = {}

    def probe(module: ModuleType, args: Sequence[str], *, timeout_s: float,
              on_line: Callable[[int, str], None] | None = None) -> Mapping[int, ProbeOutcome]:
        source = Path(str(module.__file__)).read_text(encoding="utf-8")

        def one(rank: int) -> Any:
            if rank not in executors:
                executors[rank] = open_executor(targets[rank])
            executor = executors[rank]
            res = executor.run(["python3", "-c", source, *args], timeout_s=timeout_s)
            lines = res.stdout.splitlines()
            for line in lines[:-1]:
                if on_line is not None:
                    on_line(rank, line)
            if res.exit_code != 0 or not lines:
                detail = (res.stderr.strip().splitlines() or ["no output"])[-1]
                raise ExecError(f"probe exited {res.exit_code}: {detail}", host=targets[rank].host,
                                hint="the node needs python3 (3.9 or newer) on PATH")
            try:
                return json.loads(lines[-1])
            except ValueError:
                raise ExecError(f"probe printed no result line: {lines[-1][:200]}", host=targets[rank].host) from None

        with FanOut() as fan:
            return {o.item: o for o in fan.map(one, sorted(targets))}

    try:
        yield probe
    finally:
        for executor in executors.values():
            with contextlib.suppress(Exception):
                executor.close()
