"""Launch fan-out over SSH to 1, 8 and 32 hosts in one run: connect + detached start, then teardown; then
the same through Ray to 4 and 8 of those hosts, against SSH.

Usage (root; builds its own rig of network-namespace hosts and removes it):
    python bench/fanout.py [--sizes 1,8,32] [--ray-sizes 4,8] [--runs 5]
Measures, per size, the wall time of the launch fan-out phase exactly as `k3deploy launch` does it
(NodeFleet: connect+authenticate every host, then a detached start of a cheap process on each) and the
time of a second command round over the open connections; prints medians and the largest/smallest
ratio. Target: 32 hosts within 2x of 1 host (serial would be ~32x).

On one machine the fake hosts' sshds share its CPUs with the client, so the run also reports the CPU
seconds a round costs (client + every sshd) and the floor that sets: CPU / cores. Wall time near that
floor means the fan-out adds no serialisation of its own; the rest is the handshake work itself.

Ray: a real cluster on the same hosts (one Ray node each, plus a driver node in the root namespace, as the
test rig builds it); a round joins the cluster, maps each host to its Ray node, places one agent actor per
host and starts the same cheap process through it, exactly as `k3deploy launch --executor ray` does.
SSH is measured at the Ray sizes too, so both columns come from the same hosts in the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where the started commands log: the rig's hosts share this machine's file system; main() makes it and
# removes it at the end, so the bench leaves nothing behind.
LOG_DIR = Path(tempfile.gettempdir())
sys.path.insert(0, str(ROOT))

from k3deploy.executors import Executor, NodeFleet, ProcessHandle, RayTarget, SshTarget
from tests.rig import HostRig
from tests.rig.ray_cluster import RAY_ENV, RayRig


def _hosts_cpu_s(rig: HostRig, n: int) -> float:
    """CPU seconds used so far inside the first n hosts: each sshd master with its reaped children, plus
    every live process there (connection handlers, sessions) - utime+stime+cutime+cstime."""
    total = 0
    for h in rig.hosts[:n]:
        for pid in {rig.sshd_pid(h), *rig.pids(h, root_ns=True)}:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited between listing and reading: its time moved to the master's cutime
            total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def one_round(rig: HostRig, n: int, ray_address: str | None = None,
              run: int = 0) -> tuple[float, float, float, float]:
    """(connect+start seconds, one more command round seconds, CPU seconds of connect+start in client and
    hosts, of which in this client process) for the first n hosts, over SSH or (with ray_address) through
    Ray; stops what it started."""
    targets: list[SshTarget | RayTarget]
    if ray_address is None:
        targets = [SshTarget(host=h.name, ssh_config=str(rig.ssh_config_path),
                              known_hosts=str(rig.known_hosts_path)) for h in rig.hosts[:n]]
    else:
        targets = [RayTarget(host=h.name, node_ip=h.priv_ip, ray_address=ray_address)
                   for h in rig.hosts[:n]]
    with NodeFleet(dict(enumerate(targets))) as fleet:
        def connect_start(rank: int, ex: Executor) -> ProcessHandle:
            ex.connect()
            # One tag per host and round: a Ray agent is named after it.
            return ex.start("sleep 60", str(LOG_DIR / "fanout.log"), "/tmp", f"bench-fanout.{ex.host}.{n}-{run}")

        own0, hosts0 = _own_cpu_s(), _hosts_cpu_s(rig, n)
        t0 = time.perf_counter()
        started = fleet.map(connect_start)
        fan = time.perf_counter() - t0
        own = _own_cpu_s() - own0
        cpu = own + _hosts_cpu_s(rig, n) - hosts0
        failed = [o.error for o in started.values() if not o.ok]
        handles = {rank: o.value for rank, o in started.items() if o.value is not None}
        t0 = time.perf_counter()
        fleet.map(lambda rank, ex: ex.alive(handles[rank]), handles)
        again = time.perf_counter() - t0
        fleet.map(lambda rank, ex: ex.signal(handles[rank], signal.SIGKILL), handles)
        fleet.map(lambda rank, ex: ex.signal(handles[rank], 0), handles)  # nothing left: a Ray agent goes at close
    if failed:
        raise SystemExit(f"fan-out to {n} hosts failed: {failed[0]}")
    return fan, again, cpu, own


def _leftovers(rig: HostRig, wait_s: float = 5.0) -> dict[str, list[int]]:
    """Processes still running in any host once closed sessions have had `wait_s` to end."""
    deadline = time.monotonic() + wait_s
    for _ in range(1000):
        left = {h.name: rig.pids(h) for h in rig.hosts}
        left = {name: pids for name, pids in left.items() if pids}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
    return left


def _ray_leftovers(rig: HostRig, n: int, wait_s: float = 10.0) -> dict[str, list[int]]:
    """Agents or bench processes still alive on the first n hosts (Ray's own daemons are expected)."""
    def left_on(h: object) -> list[int]:
        found = []
        for pid in rig.pids(h, root_ns=True):  # type: ignore[arg-type]
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"K3DEPLOY_RUN=bench-fanout" in env or b"ray::NodeAgent" in cmd:
                found.append(pid)
        return found

    deadline = time.monotonic() + wait_s
    for _ in range(1000):
        left = {h.name: pids for h in rig.hosts[:n] if (pids := left_on(h))}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
    return left


def ray_rounds(rig: HostRig, sizes: list[int],
               runs: int) -> tuple[float, dict[int, tuple[float, ...]], dict[str, list[int]]]:
    """(cluster start seconds, size -> medians (connect+start, command round, CPU), leftovers) through Ray on
    the first max(sizes) hosts; the cluster is torn down before returning."""
    os.environ.update(RAY_ENV)  # this process is a Ray driver
    t0 = time.perf_counter()
    with RayRig(rig, max(sizes)) as cluster:
        up = time.perf_counter() - t0
        one_round(rig, max(sizes), cluster.address, run=99)  # warm-up: first worker starts, .pyc
        results: dict[int, tuple[list[float], ...]] = {n: ([], [], [], []) for n in sizes}
        for run in range(max(1, runs)):
            for n in sizes:
                for i, value in enumerate(one_round(rig, n, cluster.address, run)):
                    results[n][i].append(value)
        left = _ray_leftovers(rig, max(sizes))
    med = {n: tuple(statistics.median(x) for x in lists) for n, lists in results.items()}
    return up, med, left


def main() -> int:
    global LOG_DIR
    LOG_DIR = Path(tempfile.mkdtemp(prefix="k3bench-"))
    try:
        return _run()
    finally:
        shutil.rmtree(LOG_DIR, ignore_errors=True)


def _run() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,8,32", help="comma-separated host counts")
    ap.add_argument("--ray-sizes", default="4,8", help="host counts compared through Ray ('' to skip Ray)")
    ap.add_argument("--runs", type=int, default=5, help="rounds per size (median reported)")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    ray_sizes = sorted({int(s) for s in args.ray_sizes.split(",") if s.strip()})
    ssh_sizes = sorted(set(sizes) | set(ray_sizes))
    t0 = time.perf_counter()
    with HostRig(max(ssh_sizes)) as rig:
        up = time.perf_counter() - t0
        one_round(rig, max(ssh_sizes))  # warm-up: page cache, sshd binaries, .pyc
        results: dict[int, tuple[list[float], ...]] = {n: ([], [], [], []) for n in ssh_sizes}
        for run in range(max(1, args.runs)):
            for n in ssh_sizes:  # interleaved, so machine noise hits every size alike
                for i, value in enumerate(one_round(rig, n, run=run)):
                    results[n][i].append(value)
        leftovers = _leftovers(rig)
        ray = ray_rounds(rig, ray_sizes, args.runs) if ray_sizes and not leftovers else None
        if ray is not None:
            leftovers = {**ray[2], **_leftovers(rig)}  # after the cluster's teardown the hosts are empty again
    cores = os.cpu_count() or 1
    print(f"rig of {max(ssh_sizes)} hosts up in {up:.2f} s; {args.runs} runs per size, {cores} cores, medians:")
    print(f"{'hosts':>5}  {'connect+start':>14}  {'per host':>9}  {'command round':>14}  {'CPU (all)':>10}  "
          f"{'CPU floor':>10}  {'wall/floor':>10}")
    med = {n: tuple(statistics.median(x) for x in lists) for n, lists in results.items()}
    for n in ssh_sizes:
        fan, again, cpu, _ = med[n]
        floor = cpu / cores
        print(f"{n:>5}  {fan * 1000:>11.0f} ms  {fan / n * 1000:>6.1f} ms  {again * 1000:>11.0f} ms  "
              f"{cpu * 1000:>7.0f} ms  {floor * 1000:>7.0f} ms  {fan / floor if floor else 0:>9.2f}x")
    lo, hi = sizes[0], sizes[-1]
    ratio = med[hi][0] / med[lo][0]
    print(f"ratio {hi}-host / {lo}-host connect+start: {ratio:.2f}x (target < 2x; serial ~{hi / lo:.0f}x); "
          f"command round: {med[hi][1] / med[lo][1]:.2f}x")
    print(f"CPU per host: {med[hi][2] / hi * 1000:.0f} ms ({med[hi][3] / hi * 1000:.0f} in this client, "
          f"{(med[hi][2] - med[hi][3]) / hi * 1000:.0f} in the hosts' sshd and sessions); on {cores} cores {hi} hosts cannot take "
          f"less than {med[hi][2] / cores * 1000:.0f} ms = {med[hi][2] / cores / med[lo][0]:.1f}x the {lo}-host time")
    if ray is not None:
        ray_up, ray_med, _ = ray
        print(f"\nRay on the same hosts (cluster of {max(ray_sizes)} nodes + driver node up in {ray_up:.1f} s), "
              "medians; a Ray round includes joining the cluster and placing one agent actor per host:")
        print(f"{'hosts':>5}  {'Ray connect+start':>18}  {'SSH connect+start':>18}  {'Ray/SSH':>8}  "
              f"{'Ray command round':>18}  {'SSH command round':>18}  {'Ray/SSH':>8}  {'Ray CPU (all)':>14}")
        for n in ray_sizes:
            (rfan, ragain, rcpu, _), (sfan, sagain) = ray_med[n], med[n][:2]
            print(f"{n:>5}  {rfan * 1000:>15.0f} ms  {sfan * 1000:>15.0f} ms  {rfan / sfan:>7.2f}x  "
                  f"{ragain * 1000:>15.0f} ms  {sagain * 1000:>15.0f} ms  {ragain / sagain:>7.2f}x  "
                  f"{rcpu * 1000:>11.0f} ms")
        rlo, rhi = ray_sizes[0], ray_sizes[-1]
        print(f"ratio Ray {rhi}-host / {rlo}-host connect+start: {ray_med[rhi][0] / ray_med[rlo][0]:.2f}x "
              f"(SSH: {med[rhi][0] / med[rlo][0]:.2f}x)")
        print(f"Ray CPU per host: {ray_med[rhi][2] / rhi * 1000:.0f} ms (driver + each node's Ray processes, mostly "
              f"the agent's worker process starting); on {cores} cores {rhi} hosts cannot take less than "
              f"{ray_med[rhi][2] / cores * 1000:.0f} ms")
    if leftovers:
        print(f"LEFTOVER processes: {leftovers}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
