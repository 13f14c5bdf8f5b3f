"""`k3deploy launch FILE --skip-preflight` to ready and `k3deploy stop NAME` as users type them, at 4 and 32
SSH hosts in one run, beside the floors they cannot beat.

Usage (root; builds its own rig of network-namespace hosts and removes it):
    python bench/cli_scale.py [--sizes 4,32] [--runs 3] [--settle-s 3]
Per size and run, with an engine that serves at once (tests/unit/test_launch_support.py FAKE_ENGINE), each
command a fresh process exactly as a shell starts it (the `k3deploy` next to this interpreter):
- cli: `k3deploy --version`: the interpreter and the CLI's own start-up, paid by every command at any size;
- engines: one connect to every host, one round starting every node's engine, rank 0 asked every 20 ms until
  it serves (bench/scale.py's engine floor): the least any launch of these engines costs on these cores;
- launch: `k3deploy launch FILE --skip-preflight` from exec to exit (ready, supervisor spawned);
- stop: `k3deploy stop NAME`, --settle-s after the supervisor said "supervising", from exec to exit;
  the supervisor's own log stamps split it into: signal to supervisor -> nodes stopped -> exit.
- CPU seconds of each command: k3deploy's own (the CLI; for the stop also the supervisor while it ran) and
  the hosts' (every process in their namespaces: sshd, sessions, the engines), read from the kernel, so a
  busy machine does not change them. All hosts share this machine's cores: a command cannot take less wall
  time than (own + hosts) / cores, the rig's floor (on real machines each host has cores of its own).
Sizes run interleaved, so machine noise hits all alike; the load average is printed with the figures.
Done when launch and stop at the largest size cost at most 1.5x the smallest (launch: at most 1.5x the
engine floor's ratio where the engines themselves are what grows); where the hosts' share of this
machine's cores makes that impossible, k3deploy's own CPU at the largest size within 1.5x the smallest.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fanout import _hosts_cpu_s, _leftovers
from scale import _cpu_s, _topology, engine_floor

from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.records.store import StateStore
from tests.rig import HostRig

_STAMP = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) ", re.MULTILINE)


@dataclass
class Sample:
    """One run at one size, in seconds; the stop split by the supervisor's log stamps (ms) into: until the
    supervisor notices it was asked (the CLI's start-up, the signal), its stopping of the nodes, its exit,
    and the CLI's end after that."""

    cli_s: float
    engines_s: float
    launch_s: float
    stop_s: float
    to_asked_s: float
    nodes_s: float
    exit_s: float
    after_s: float
    launch_cpu_s: float  # CPU seconds: the launch CLI itself, and every process in the hosts while it ran
    launch_hosts_cpu_s: float
    stop_cpu_s: float  # the stop CLI, the supervisor while the stop ran, the hosts
    stop_supervisor_cpu_s: float
    stop_hosts_cpu_s: float


def k3deploy_argv() -> list[str]:
    """The console script users run (next to this interpreter), else `python -m k3deploy`."""
    script = Path(sys.executable).with_name("k3deploy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "k3deploy"]


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: list[str], timeout_s: float = 300) -> tuple[float, float]:
    """(seconds from exec to exit, CPU seconds) of one command; its output goes into the error when it fails."""
    c0, t0 = _children_cpu_s(), time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                         env={**os.environ, "COLUMNS": "200"})
    took, cpu = time.perf_counter() - t0, _children_cpu_s() - c0
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(argv[-3:])}: exit {run.returncode}\n{run.stdout}{run.stderr}")
    return took, cpu


class CpuOf:
    """The CPU seconds a process has used, sampled until it exits (its last sample is what it used)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.first, self.last = pid, _cpu_s(pid), 0.0
        self.last = self.first
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        for _ in range(100_000):  # 20 ms apart: until the process is gone (at most ~30 min)
            try:
                self.last = _cpu_s(self.pid)
            except (OSError, IndexError):
                return
            time.sleep(0.02)

    def used(self) -> float:
        """CPU seconds since this object was made (waits for the sampler once the process is gone)."""
        self._thread.join(5)
        return self.last - self.first


def _seconds(line_stamp: re.Match[str]) -> float:
    h, m, s, ms = (int(x) for x in line_stamp.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def stop_phases(log: str, began: float, ended: float) -> tuple[float, float, float, float]:
    """(began -> 'asked to stop', -> last node 'stopped', -> 'supervisor exits', -> ended) from the
    supervisor's log (stamps are wall-clock time of day; began and ended are time.time())."""
    lt = time.localtime(began)
    midnight = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, lt.tm_isdst))  # stamps: time of day

    def at(predicate: Callable[[str], bool], last: bool = False) -> float:
        found = [_seconds(m) for x in log.splitlines() if (m := _STAMP.match(x)) and predicate(x)]
        if not found:
            return float("nan")
        return midnight + (max(found) if last else min(found))

    asked = at(lambda x: x.endswith("group: asked to stop"))
    stopped = at(lambda x: x.endswith(": stopped"), last=True)
    exits = at(lambda x: "supervisor exits" in x)
    return asked - began, stopped - asked, exits - stopped, ended - exits


def one_run(rig: HostRig, tmp: Path, n: int, run: int, settle_s: float) -> Sample:
    """The CLI floor, the engine floor, then launch and stop as a user types them, for the first n hosts."""
    k3 = k3deploy_argv()
    cli = timed([*k3, "--version"])[0]
    topo = _topology(rig, tmp, n, run)
    cat = catalog_for(None)
    plan = require_feasible(topo, cat)
    name = plan.topology.name
    engines = engine_floor(jobs_for(plan, None, cat), run)
    hosts0 = _hosts_cpu_s(rig, n)
    launched, launch_cpu = timed([*k3, "launch", str(topo), "--skip-preflight"])
    launch_hosts = _hosts_cpu_s(rig, n) - hosts0
    state = Path(plan.topology.launch.state_dir or "")
    log = state / f"{name}.supervisor.log"
    owner = StateStore(state).require(name).owner
    assert owner is not None
    if settle_s >= 0:  # else: at once, as a script typing both commands would
        for _ in range(600):  # its imports and connections are its start-up: 60 s at most
            if log.exists() and "supervising" in log.read_text():
                break
            time.sleep(0.1)
        time.sleep(settle_s)
    supervisor, hosts0 = CpuOf(owner.pid), _hosts_cpu_s(rig, n)
    began = time.time()
    stopped, stop_cpu = timed([*k3, "stop", name, "--state-dir", str(state)])
    phases = stop_phases(log.read_text(), began, time.time())
    return Sample(cli, engines, launched, stopped, *phases, launch_cpu, launch_hosts, stop_cpu, supervisor.used(),
                  _hosts_cpu_s(rig, n) - hosts0)


def own_stop(m: Sample) -> float:
    """CPU seconds k3deploy itself spent on a stop: the CLI and the supervisor."""
    return m.stop_cpu_s + m.stop_supervisor_cpu_s


def load() -> str:
    """The 1-minute load average and the core count, for the figures' context."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,32", help="comma-separated host counts (4, 8, 16 or 32)")
    ap.add_argument("--runs", type=int, default=3, help="runs per size (median reported)")
    ap.add_argument("--settle-s", type=float, default=3.0,
                    help="seconds between the supervisor's 'supervising' and the stop (-1: stop as soon as launch exits)")
    args = ap.parse_args()
    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        raise SystemExit("needs openssh-server (sshd) and root: the hosts are network namespaces")
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    results: dict[int, list[Sample]] = {n: [] for n in sizes}
    loads: list[str] = []
    with HostRig(max(sizes)) as rig, tempfile.TemporaryDirectory(prefix="k3cliscale-") as tmpdir:
        tmp = Path(tmpdir)
        one_run(rig, tmp, sizes[0], 99, 0.5)  # warm-up: page cache, .pyc, sshd binaries
        for run in range(max(1, args.runs)):
            loads.append(load())
            for n in sizes:  # interleaved
                s = one_run(rig, tmp, n, run, args.settle_s)
                results[n].append(s)
                print(f"run {run} {n:>2} hosts: cli {s.cli_s:.2f}s engines {s.engines_s:.2f}s launch "
                      f"{s.launch_s:.2f}s (CPU {s.launch_cpu_s:.2f} + hosts {s.launch_hosts_cpu_s:.2f}) stop "
                      f"{s.stop_s:.2f}s = to asked {s.to_asked_s:.2f} + nodes {s.nodes_s:.2f} + exit {s.exit_s:.2f} "
                      f"+ after {s.after_s:.2f} (CPU {s.stop_cpu_s:.2f} + supervisor {s.stop_supervisor_cpu_s:.2f} "
                      f"+ hosts {s.stop_hosts_cpu_s:.2f}); {load()}", flush=True)
        loads.append(load())
        leftovers = _leftovers(rig)
    fields = [f.name for f in dataclasses.fields(Sample)]
    med = {n: Sample(*(statistics.median(getattr(s, f) for s in results[n]) for f in fields)) for n in sizes}
    print(f"\n{args.runs} runs per size, medians ({'; '.join(loads)}):")
    print(f"{'hosts':>5}  {'cli':>6}  {'engines':>7}  {'launch':>7}  {'stop':>6}  {'= to asked':>10}  {'+ nodes':>7}  "
          f"{'+ exit':>6}  {'+ after':>7}")
    for n in sizes:
        m = med[n]
        print(f"{n:>5}  {m.cli_s:>5.2f}s  {m.engines_s:>6.2f}s  {m.launch_s:>6.2f}s  {m.stop_s:>5.2f}s  "
              f"{m.to_asked_s:>9.2f}s  {m.nodes_s:>6.2f}s  {m.exit_s:>5.2f}s  {m.after_s:>6.2f}s")
    cores = os.cpu_count() or 1
    print(f"CPU seconds (what load does not change): k3deploy's own (launch: its CLI; stop: its CLI + the "
          f"supervisor) + the hosts' (sshd, sessions, engines); all {max(sizes)} hosts share these {cores} cores, so "
          f"no command can take less than the sum / {cores} (the rig floor)")
    for n in sizes:
        m = med[n]
        lf, sf = (m.launch_cpu_s + m.launch_hosts_cpu_s) / cores, (own_stop(m) + m.stop_hosts_cpu_s) / cores
        print(f"{n:>5}  launch {m.launch_cpu_s:.2f} + {m.launch_hosts_cpu_s:.2f} (rig floor {lf:.2f}s)   stop "
              f"{own_stop(m):.2f} + {m.stop_hosts_cpu_s:.2f} (rig floor {sf:.2f}s)   hosts per node: launch "
              f"{m.launch_hosts_cpu_s / n * 1000:.0f} ms, stop {m.stop_hosts_cpu_s / n * 1000:.0f} ms")
    lo, hi = med[sizes[0]], med[sizes[-1]]
    print(f"{sizes[-1]} / {sizes[0]} hosts, k3deploy's own CPU: launch {hi.launch_cpu_s / lo.launch_cpu_s:.2f}x, "
          f"stop {own_stop(hi) / own_stop(lo):.2f}x")
    per_run = [f"{h.launch_s / lo_.launch_s:.2f}/{h.stop_s / lo_.stop_s:.2f}"
               for lo_, h in zip(results[sizes[0]], results[sizes[-1]])]
    print(f"{sizes[-1]} / {sizes[0]} hosts: launch {hi.launch_s / lo.launch_s:.2f}x (engine floor "
          f"{hi.engines_s / lo.engines_s:.2f}x), stop {hi.stop_s / lo.stop_s:.2f}x; per run launch/stop "
          f"{', '.join(per_run)} (targets: <= 1.5x; launch <= 1.5x the engine floor's ratio)")
    if leftovers:
        print(f"LEFTOVER processes: {leftovers}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
