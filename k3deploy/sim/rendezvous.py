"""One Gloo process group across the stand-in nodes: bounded join, barriers, and a liveness heartbeat."""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from k3deploy.sim.serve_config import Rendezvous

IFNAME_ENV = "GLOO_SOCKET_IFNAME"
HEARTBEAT_INTERVAL_S = 1.0
# The head waits this long for one worker's beat; a worker waits longer for the head, whose round
# visits every worker in turn.
WORKER_SILENCE_S = 10.0
HEAD_SILENCE_S = 30.0
FAILED_EXIT_CODE = 1


def cause_of(exc: BaseException) -> str:
    """`Type: first line of the message`, without torch's C++ source location."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(". This is typically caused", 1)[0]  # Gloo's generic advice (and its emoji)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def watchdog(timeout_s: float, on_expire: Callable[[], None]) -> Iterator[None]:
    """Hard wall-clock bound on the block: on expiry call on_expire, then exit the process."""

    def fire() -> None:
        try:
            on_expire()
        finally:
            # The main thread is stuck in C++ (Gloo, TCPStore): only _exit gets out without waiting on it.
            os._exit(FAILED_EXIT_CODE)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class NodeGroup:
    """This node's membership in the Gloo group (world size = number of nodes)."""

    label = "torch.distributed gloo"

    def __init__(self, rdv: Rendezvous) -> None:
        self.rdv = rdv
        self.init_method = rdv.init_method if rdv.port else f"tcp://{rdv.host}:{free_port(rdv.host)}"
        self._dist: Any = None
        self._torch: Any = None

    @property
    def ifname(self) -> str:
        """GLOO_SOCKET_IFNAME as this process sees it (Gloo reads it itself)."""
        return os.environ.get(IFNAME_ENV) or "unset"

    def describe(self) -> str:
        """Where this node rendezvouses, for error lines."""
        return (
            f"node rank {self.rdv.node_rank} of {self.rdv.nnodes} at {self.init_method} "
            f"({IFNAME_ENV}={self.ifname})"
        )

    def _timeout(self, seconds: float) -> datetime.timedelta:
        return datetime.timedelta(seconds=max(seconds, 0.1))

    def load(self) -> None:
        """Import torch (seconds of CPU) before any timeout starts, as the engines import it at start-up."""
        # Only a process that really rendezvouses pays for torch; parsing and --help never do.
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist

    def join(self) -> float:
        """init_process_group, then an all_reduce of (rank + 1); return the sum (n(n+1)/2 when all joined)."""
        if self._dist is None:
            self.load()
        torch, dist = self._torch, self._dist
        rdv = self.rdv
        dist.init_process_group(
            "gloo",
            init_method=self.init_method,
            rank=rdv.node_rank,
            world_size=rdv.nnodes,
            timeout=self._timeout(rdv.timeout_s),
        )
        value = torch.tensor([float(rdv.node_rank + 1)])
        dist.all_reduce(value, async_op=True).wait(self._timeout(rdv.timeout_s))
        return float(value.item())

    def barrier(self, status: int, timeout_s: float) -> int:
        """All nodes meet; return the largest status any node brought (non-zero: someone failed)."""
        value = self._torch.tensor([float(status)])
        work = self._dist.all_reduce(value, op=self._dist.ReduceOp.MAX, async_op=True)
        work.wait(self._timeout(timeout_s))
        return int(value.item())

    def start_heartbeat(self, on_lost: Callable[[int, str], None], lifetime_s: float) -> threading.Thread:
        """Beat head <-> each worker in a daemon thread; on_lost(rank, cause) once, then the beat stops."""
        target = self._beat_head if self.rdv.node_rank == 0 else self._beat_worker
        deadline = time.monotonic() + lifetime_s
        thread = threading.Thread(
            target=target, args=(on_lost, deadline), name="k3sim-heartbeat", daemon=True
        )
        thread.start()
        return thread

    def _beat_head(self, on_lost: Callable[[int, str], None], deadline: float) -> None:
        dist, beat = self._dist, self._torch.zeros(1)
        wait = self._timeout(WORKER_SILENCE_S)
        while time.monotonic() < deadline:  # the server's lifetime; ends early at the first lost worker
            for rank in range(1, self.rdv.nnodes):
                try:
                    dist.irecv(beat, src=rank).wait(wait)
                    dist.isend(beat, dst=rank).wait(wait)
                except Exception as exc:  # noqa: BLE001 - any Gloo failure means the node is gone
                    on_lost(rank, cause_of(exc))
                    return
            time.sleep(HEARTBEAT_INTERVAL_S)

    def _beat_worker(self, on_lost: Callable[[int, str], None], deadline: float) -> None:
        dist, beat = self._dist, self._torch.zeros(1)
        wait = self._timeout(HEAD_SILENCE_S)
        while time.monotonic() < deadline:  # the server's lifetime; ends early when the head is gone
            try:
                dist.isend(beat, dst=0).wait(wait)
                dist.irecv(beat, src=0).wait(wait)
            except Exception as exc:  # noqa: BLE001 - any Gloo failure means the head is gone
                on_lost(0, cause_of(exc))
                return
