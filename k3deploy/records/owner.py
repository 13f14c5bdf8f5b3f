"""The owner of a record: a local process k3deploy owns (the launching CLI, the supervisor), by an identity that
survives PID reuse."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

Role = Literal["launch", "supervisor", "attach"]


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Start time in clock ticks since boot, or None if the process is gone."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


class Identity(BaseModel):
    """A local process as the state records it: PID plus start time (a reused PID does not match)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    start_ticks: int | None
    role: Role

    @classmethod
    def me(cls, role: Role) -> Identity:
        """This process."""
        return cls(pid=os.getpid(), start_ticks=start_ticks(os.getpid()), role=role)

    def alive(self) -> bool:
        """Running (not a zombie) and the same process that was recorded."""
        fields = _stat(self.pid)
        if not fields or fields[0] in ("Z", "X", "x"):
            return False
        return self.start_ticks is None or int(fields[19]) == self.start_ticks

    def terminate(self, timeout_s: float) -> bool:
        """SIGTERM, wait up to timeout_s, then SIGKILL; True once it is gone."""
        if self.pid == os.getpid():
            return True  # the caller is the owner and stops the nodes itself
        if not self.alive():
            return True
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not self.alive():
                    return True
                time.sleep(0.05)
        return not self.alive()
