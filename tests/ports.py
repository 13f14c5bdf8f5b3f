"""TCP ports for tests, each one the start of a block of STRIDE ports that were all free when handed out and that no
other test process on this machine is handed while this one lives.

Why not `bind(("127.0.0.1", 0))` and release: that port comes from the kernel's ephemeral range (32768-60999),
where every outgoing connection, every `bind(0)` of another test and the engines' own internal sockets take ports
too, so between the release and the test's server binding it anyone may take it (CI failed on that: a stand-in's
port "already in use"); and two of them can be neighbours, so `launch.port + i` (one port per replica) ran into a
router's metrics port. Here ports come from 21000-28999: above Ray's worker ports (10002-19999), below the
ephemeral range, and clear of every fixed port the project's topologies, assets and engines name (launch.port
20000, the routers' metrics 29000, torch's 29500-29502, SGLang's and the assets' routers' 30000-30001: a block
handed out at 30000 once put an engine on the asset's router port). A block is reserved by an abstract unix
socket named after it, which the kernel drops when the process exits (nothing to clean up; per network
namespace, like the ports themselves), so the three xdist workers and the real-engine tier's two runs never
share one.
"""
from __future__ import annotations

import random
import socket
import threading

FIRST = 21000
LAST = 29000
STRIDE = 8  # launch.port + i for up to eight replicas, or a server's neighbours
_BLOCKS = (LAST - FIRST) // STRIDE
_held: list[socket.socket] = []
_lock = threading.Lock()
_cursor = random.randrange(_BLOCKS)  # each process starts somewhere else: fewer reservations to step over


def _reserve(start: int) -> socket.socket | None:
    reservation = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        reservation.bind(f"\0k3deploy-tests-port-{start}")
    except OSError:  # another live test process holds this block
        reservation.close()
        return None
    return reservation


def _all_free(start: int) -> bool:
    """Every port of the block binds on every address now (no listener, no TIME_WAIT left behind)."""
    for port in range(start, start + STRIDE):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A port nothing listens on, with the STRIDE - 1 ports above it free too; this process's until it exits."""
    global _cursor
    with _lock:
        for attempt in range(2 * _BLOCKS):
            if attempt == _BLOCKS:  # every block held or busy: let go of the older half of ours (finished tests')
                for old in _held[: len(_held) // 2]:
                    old.close()
                del _held[: len(_held) // 2]
            _cursor = (_cursor + 1) % _BLOCKS
            start = FIRST + _cursor * STRIDE
            reservation = _reserve(start)
            if reservation is None:
                continue
            if _all_free(start):
                _held.append(reservation)
                return start
            reservation.close()
    raise RuntimeError(f"no free block of {STRIDE} ports in {FIRST}-{LAST - 1}")


def free_ports(count: int) -> list[int]:
    """`count` ports from distinct blocks."""
    return [free_port() for _ in range(count)]


def closed_port() -> int:
    """A loopback port nothing listens on (a connect is refused)."""
    return free_port()
