"""The live display while stages run: a line per stage as it ends, and per-node hashing progress (bytes/s, ETA)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from k3deploy.validate.stage import ProgressEvent, StageResult

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "error": "bold magenta"}


class LiveProgress:
    """Progress bars on `console` (stderr in the CLI), one per node and stage, updated from ProgressEvents."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=True)
        self.tasks: dict[tuple[str, int], TaskID] = {}

    def update(self, event: ProgressEvent) -> None:
        """Move a node's bar."""
        key = (event.stage, event.rank)
        if key not in self.tasks:
            self.tasks[key] = self.progress.add_task(f"{event.stage} node {event.rank} ({event.host})",
                                                     total=event.total)
        self.progress.update(self.tasks[key], completed=event.done, total=event.total)

    def stage(self, name: str, result: StageResult | None) -> None:
        """Say a stage started, or how it ended (its bars go)."""
        from rich.markup import escape

        shown = escape(name)  # a stage of one PD instance is named kernels[prefill0], not a markup tag
        if result is None:
            self.console.print(f"[bold]{shown}[/]: running", highlight=False)
            return
        for key in [k for k in self.tasks if k[0] == name]:
            self.progress.remove_task(self.tasks.pop(key))
        style = STATUS_STYLE[result.status]
        self.console.print(f"[bold]{shown}[/]: [{style}]{result.status}[/] in {result.seconds:.1f} s", highlight=False)


@contextlib.contextmanager
def live_progress(console: Console) -> Iterator[LiveProgress]:
    """A LiveProgress shown while the block runs."""
    live = LiveProgress(console)
    live.progress.start()
    try:
        yield live
    finally:
        live.progress.stop()
