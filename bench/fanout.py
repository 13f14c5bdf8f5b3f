"""Launch fan-out over SSH to 1, 8 and 32 hosts in one run: connect + detached start, then teardown.

Usage (root; builds its own rig of network-namespace hosts and removes it):
    python bench/fanout.py [--sizes 1,8,32] [--runs 5]
Measures, per size, the wall time of the launch fan-out phase exactly as `k3deploy launch` does it
(FanOut pool: connect+authenticate every host, then a detached start of a cheap process on each) and the
time of a second command round over the open connections; prints medians and the largest/smallest
ratio. Target: 32 hosts within 2x of 1 host (serial would be ~32x).
"""
from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from k3deploy.executors import ExecTarget, FanOut, open_executor
from tests.rig import HostRig


def one_round(rig: HostRig, n: int, pool: FanOut) -> tuple[float, float]:
    """(connect+start seconds, one more command round seconds) for the first n hosts; stops what it started."""
    targets = [ExecTarget(kind="ssh", host=h.name, ssh_config=str(rig.ssh_config_path),
                          known_hosts=str(rig.known_hosts_path)) for h in rig.hosts[:n]]
    executors = [open_executor(t) for t in targets]

    def connect_start(ex: object) -> object:
        ex.connect()  # type: ignore[attr-defined]
        return ex.start("sleep 60", "/tmp/k3bench/fanout.log", "/tmp", "bench-fanout")  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    started = pool.map(connect_start, executors)
    fan = time.perf_counter() - t0
    failed = [o.error for o in started if not o.ok]
    t0 = time.perf_counter()
    pool.map(lambda pair: pair[0].alive(pair[1]), [(e, o.value) for e, o in zip(executors, started) if o.ok])
    again = time.perf_counter() - t0
    pool.map(lambda pair: pair[0].signal(pair[1], signal.SIGKILL),
             [(e, o.value) for e, o in zip(executors, started) if o.ok])
    pool.map(lambda e: e.close(), executors)
    if failed:
        raise SystemExit(f"fan-out to {n} hosts failed: {failed[0]}")
    return fan, again


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
        results: dict[int, tuple[list[float], list[float]]] = {n: ([], []) for n in sizes}
        for _ in range(max(1, args.runs)):
            for n in sizes:  # interleaved, so machine noise hits every size alike
                fan, again = one_round(rig, n, pool)
                results[n][0].append(fan)
                results[n][1].append(again)
        leftovers = _leftovers(rig)
    print(f"rig of {max(sizes)} hosts up in {up:.2f} s; {args.runs} runs per size, medians:")
    print(f"{'hosts':>5}  {'connect+start':>14}  {'per host':>9}  {'command round':>14}")
    med = {n: (statistics.median(a), statistics.median(b)) for n, (a, b) in results.items()}
    for n in sizes:
        fan, again = med[n]
        print(f"{n:>5}  {fan * 1000:>11.0f} ms  {fan / n * 1000:>6.1f} ms  {again * 1000:>11.0f} ms")
    lo, hi = sizes[0], sizes[-1]
    ratio = med[hi][0] / med[lo][0]
    print(f"ratio {hi}-host / {lo}-host connect+start: {ratio:.2f}x (target < 2x; serial ~{hi / lo:.0f}x); "
          f"command round: {med[hi][1] / med[lo][1]:.2f}x")
    if leftovers:
        print(f"LEFTOVER processes: {leftovers}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
