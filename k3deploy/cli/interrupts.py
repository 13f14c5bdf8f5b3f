"""How a foreground launch unwinds when `k3deploy stop` signals it (shared by the launch commands)."""
from __future__ import annotations

import signal


def sigterm_interrupts() -> None:
    """`k3deploy stop` from another shell sends SIGTERM: unwind like Ctrl-C, stopping started nodes."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
