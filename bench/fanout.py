"""Launch fan-out over SSH to 1, 8 and 32 hosts in one run: connect + detached start, then teardown.

Usage (root; builds its own rig of network-namespace hosts and removes it):
    python bench/fanout.py [--sizes 1,8,32] [--runs 5]
Measures, per size, the wall time of the launch fan-out phase exactly as `k3deploy launch` does it
(FanOut pool: connect+authenticate every host, then a detached start of a cheap process on each) and the
time of a second command round over the open connections; prints medians and the largest/smallest
ratio. Target: 32 hosts within 2x of 1 host (serial would be ~32x).

On one machine the fake hosts' sshds share its CPUs with the client, so the run also reports the CPU
seconds a round costs (client + every sshd) and the floor that sets: CPU / cores. Wall time near that
floor means the fan-out adds no serialisation of its own; the rest is the handshake work itself.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from k3deploy.executors import ExecTarget, FanOut, open_executor
from tests.rig import HostRig


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


def one_round(rig: HostRig, n: int, pool: FanOut) -> tuple[float, float, float]:
    """(connect+start seconds, one more command round seconds, CPU seconds of connect+start in client and
    hosts) for the first n hosts; stops what it started."""
    targets = [ExecTarget(kind="ssh", host=h.name, ssh_config=str(rig.ssh_config_path),
                          known_hosts=str(rig.known_hosts_path)) for h in rig.hosts[:n]]
    executors = [open_executor(t) for t in targets]

    def connect_start(ex: object) -> object:
        ex.connect()  # type: ignore[attr-defined]
        return ex.start("sleep 60", "/tmp/k3bench/fanout.log", "/tmp", "bench-fanout")  # type: ignore[attr-defined]

    cpu0 = _own_cpu_s() + _hosts_cpu_s(rig, n)
    t0 = time.perf_counter()
    started = pool.map(connect_start, executors)
    fan = time.perf_counter() - t0
    cpu = _own_cpu_s() + _hosts_cpu_s(rig, n) - cpu0
    failed = [o.error for o in started if not o.ok]
    t0 = time.perf_counter()
    pool.map(lambda pair: pair[0].alive(pair[1]), [(e, o.value) for e, o in zip(executors, started) if o.ok])
    again = time.perf_counter() - t0
    pool.map(lambda pair: pair[0].signal(pair[1], signal.SIGKILL),
             [(e, o.value) for e, o in zip(executors, started) if o.ok])
    pool.map(lambda e: e.close(), executors)
    if failed:
        raise SystemExit(f"fan-out to {n} hosts failed: {failed[0]}")
    return fan, again, cpu


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,8,32", help="comma-separated host counts")
    ap.add_argument("--runs", type=int, default=5, help="rounds per size (median reported)")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    t0 = time.perf_counter()
    with HostRig(max(sizes)) as rig, FanOut() as pool:
        up = time.perf_counter() - t0
        one_round(rig, max(sizes), pool)  # warm-up: page cache, sshd binaries, .pyc
        results: dict[int, tuple[list[float], list[float], list[float]]] = {n: ([], [], []) for n in sizes}
        for _ in range(max(1, args.runs)):
            for n in sizes:  # interleaved, so machine noise hits every size alike
                for i, value in enumerate(one_round(rig, n, pool)):
                    results[n][i].append(value)
        leftovers = _leftovers(rig)
    cores = os.cpu_count() or 1
    print(f"rig of {max(sizes)} hosts up in {up:.2f} s; {args.runs} runs per size, {cores} cores, medians:")
    print(f"{'hosts':>5}  {'connect+start':>14}  {'per host':>9}  {'command round':>14}  {'CPU (all)':>10}  "
          f"{'CPU floor':>10}  {'wall/floor':>10}")
    med = {n: tuple(statistics.median(x) for x in lists) for n, lists in results.items()}
    for n in sizes:
        fan, again, cpu = med[n]
        floor = cpu / cores
        print(f"{n:>5}  {fan * 1000:>11.0f} ms  {fan / n * 1000:>6.1f} ms  {again * 1000:>11.0f} ms  "
              f"{cpu * 1000:>7.0f} ms  {floor * 1000:>7.0f} ms  {fan / floor if floor else 0:>9.2f}x")
    lo, hi = sizes[0], sizes[-1]
    ratio = med[hi][0] / med[lo][0]
    print(f"ratio {hi}-host / {lo}-host connect+start: {ratio:.2f}x (target < 2x; serial ~{hi / lo:.0f}x); "
          f"command round: {med[hi][1] / med[lo][1]:.2f}x")
    print(f"CPU per host: {med[hi][2] / hi * 1000:.0f} ms (client + sshd); on {cores} cores {hi} hosts cannot take "
          f"less than {med[hi][2] / cores * 1000:.0f} ms = {med[hi][2] / cores / med[lo][0]:.1f}x the {lo}-host time")
    if leftovers:
        print(f"LEFTOVER processes: {leftovers}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
