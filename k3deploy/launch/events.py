"""Progress events from launch and supervision; the CLI turns them into a per-node display."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# connecting, connected, unreachable, starting, started, loading, ready, failed, stopping, stopped,
# restarting (rank -1 marks events about the whole group).
GROUP = -1


@dataclass(frozen=True)
class NodeEvent:
    """One node changed phase."""

    rank: int
    host: str
    phase: str
    detail: str = ""
    at: float = field(default_factory=time.time)


EventSink = Callable[[NodeEvent], None]


def ignore(event: NodeEvent) -> None:
    """The default sink."""
