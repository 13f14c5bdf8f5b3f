"""A pytest plugin: local deployments this test process started are stopped when the session ends or the
process gets SIGTERM (a run killed mid-test left fake-engine nodes orphaned to init), by their own tags."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

# Deployment name -> its state dir, registered by the `name` fixture while its test runs.
STARTED: dict[str, Path] = {}


def sweep() -> list[str]:
    """Stop every registered deployment's supervisor and tagged processes; the names that had any running."""
    if not STARTED:
        return []
    from tests.unit.test_launch_support import stop_left

    found = [name for name, state_dir in list(STARTED.items()) if stop_left(name, state_dir) != (False, [])]
    STARTED.clear()
    return found


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    sweep()
    # Then die of SIGTERM as before, so whoever sent it sees the same exit.
    signal.signal(signum, _PREVIOUS if callable(_PREVIOUS) else signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_PREVIOUS: Any = signal.SIG_DFL


def pytest_configure(config: pytest.Config) -> None:
    """Sweep on SIGTERM (the main thread only may set handlers; a worker thread's run simply skips it), and
    make SIGINT a KeyboardInterrupt even where it came in ignored."""
    global _PREVIOUS
    if sys.platform != "win32":
        try:
            _PREVIOUS = signal.signal(signal.SIGTERM, _on_sigterm)
            # A pytest a script starts in the background (scripts/real_tier.sh's two runs, or any run of a
            # script itself started with `&`) inherits SIGINT ignored, and Python then installs no handler:
            # the SIGINT that ends a run tearing its fixtures down (engines, rigs) would do nothing.
            if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:
            pass


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Sweep at the end of every session, Ctrl-C included (pytest finishes the session on KeyboardInterrupt)."""
    sweep()
