"""Per-host disks and link rates for a rig: each host's sshd is PID 1 of its own mount namespace (unshare's
default propagation is private), so a bind mount or a tmpfs made there is that host's own disk at a path every
host names alike, invisible to the root namespace and to the other hosts; `tc` tbf on both ends of a host's
private veth caps what it sends and what it receives at one rate. Both go with the host: its mount namespace
dies with its sshd, its veth with its network namespace (the rig's teardown); `unlimit` removes a rate early."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .hosts import HostRig
from .netns import PRIV_IFACE, RigError


def _exec(rig: HostRig, host: str, argv: list[str]) -> None:
    run = rig.exec(host, argv, timeout_s=30.0)
    if run.returncode != 0:
        raise RigError(f"{host}: {' '.join(argv)}: {run.stderr.strip()}")


def own_disk(rig: HostRig, host: str, at: str, backing: Path) -> None:
    """`at` on `host` becomes the directory `backing` of this machine (a bind mount in the host's mount
    namespace): what the host writes at `at` lands in `backing` only."""
    backing.mkdir(parents=True, exist_ok=True)
    Path(at).mkdir(parents=True, exist_ok=True)  # the mount point, in the file system every host shares
    _exec(rig, host, ["mount", "--bind", str(backing), at])


def small_disk(rig: HostRig, host: str, at: str, size_bytes: int) -> None:
    """`at` on `host` becomes a tmpfs of `size_bytes` (a small disk to fill)."""
    Path(at).mkdir(parents=True, exist_ok=True)
    _exec(rig, host, ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", f"{rig.ident}disk", at])


def _tc(argv: list[str], where: str) -> None:
    run = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if run.returncode != 0:
        raise RigError(f"{where}: {' '.join(argv)}: {run.stderr.strip()}")


def _tbf(rate_bytes_s: int, queue_ms: int) -> list[str]:
    # burst: at least one timer tick's worth at the rate (HZ 250 and up), and a few jumbo frames. The queue
    # (latency) stays short: a host that sends at the rate and receives at once (a chain's middle node) queues
    # the ACKs of what it receives behind what it sends; a deep queue (200 ms measured) stretches the inbound
    # stream's round trip and each new connection's slow start, which a switch port's shallow buffer does not.
    burst = max(rate_bytes_s // 100, 64 << 10)
    return ["tbf", "rate", f"{rate_bytes_s * 8}bit", "burst", str(burst), "latency", f"{queue_ms}ms"]


def limit(rig: HostRig, host: str, rate_bytes_s: int, queue_ms: int = 20) -> None:
    """Cap `host`'s private link at `rate_bytes_s` each way: tbf on its namespace's end (what it sends) and
    on the root namespace's end (what it receives), each queueing at most `queue_ms` of traffic."""
    h = rig.host(host)
    tbf = _tbf(rate_bytes_s, queue_ms)
    _tc(["tc", "-n", h.ns, "qdisc", "replace", "dev", PRIV_IFACE, "root", *tbf], h.name)
    _tc(["tc", "qdisc", "replace", "dev", rig.priv_veth(h), "root", *tbf], h.name)


def unlimit(rig: HostRig, host: str) -> None:
    """Remove `limit`'s qdiscs from both ends of the host's private link."""
    h = rig.host(host)
    _tc(["tc", "-n", h.ns, "qdisc", "del", "dev", PRIV_IFACE, "root"], h.name)
    _tc(["tc", "qdisc", "del", "dev", rig.priv_veth(h), "root"], h.name)
