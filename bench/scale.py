"""Launch to ready, stop, and the supervisor's CPU at 4, 16 and 32 SSH hosts in one run, beside the floor.

Usage (root; builds its own rig of network-namespace hosts and removes it):
    python bench/scale.py [--sizes 4,16,32] [--runs 2] [--watch-s 20]
Per size, with an engine that starts instantly (tests/unit/test_launch_support.py FAKE_ENGINE: rank 0 serves
/health and /v1/models at once), so only k3deploy's own work is timed:
- floor: one connect to every host and one command round (`true`) over those connections, as NodeFleet
  does them; the least any launch or stop must cost;
- engines: one connect, one round starting every node's engine, rank 0 asked every 20 ms until it serves:
  the least a launch of these engines costs here, where 32 engines start on the same 2 cores as everything;
- launch: `deploy.launch` (what `k3deploy launch` runs) from the call to ready, supervisor spawned;
- supervisor CPU: utime+stime of the detached supervisor (from /proc) over --watch-s seconds while it
  watches the ready deployment, as a share of one core;
- stop: `deploy.stop` (what `k3deploy stop` runs) until every node is stopped and recorded.
Done when: launch and stop at the largest size cost at most 1.5x the smallest, each within 3x of its floor;
supervisor under 2% of a core at the largest size. Sizes run interleaved, so machine noise hits all alike.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fanout import _leftovers

from k3deploy.executors import ExecTarget, Executor, NodeFleet
from k3deploy.executors.fleet import require_all
from k3deploy.executors.http import NodeHttp, serving
from k3deploy.launch import deploy
from k3deploy.nodeplan.jobs import NodeJob, jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.records.store import StateStore
from tests.rig import HostRig
from tests.unit.test_launch_support import fake_topology

# The stand-in model has 8 attention heads: tp 8 at most, so larger groups are pipeline stages.
PARALLEL = {4: {"tp": 4, "ep": 4}, 8: {"tp": 8, "ep": 8}, 16: {"tp": 8, "ep": 8, "pp": 2},
            32: {"tp": 8, "ep": 8, "pp": 4}}
SETTLE_S = 3.0  # after it says "supervising": its connections and streams are open


@dataclass
class Sample:
    """One run at one size (seconds; CPU as a share of one core)."""

    floor_s: float
    engines_s: float
    launch_s: float
    stop_s: float
    supervisor_cpu: float


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _topology(rig: HostRig, tmp: Path, n: int, run: int) -> Path:
    hosts = rig.hosts[:n]
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in hosts]
    ssh = {"user": "root", "key": str(rig.key_path), "known_hosts": str(rig.known_hosts_path), "connect_timeout_s": 5}
    path = fake_topology(tmp, f"scale{n}-{run}", nodes=n, parallel=PARALLEL[n],
                         launch={"executor": "ssh", "ssh": ssh, "ready_timeout_s": 120, "stop_grace_s": 5})
    doc = yaml.safe_load(path.read_text())
    doc["nodes"] = nodes  # the rig's hosts instead of localhost
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def floor_round(targets: dict[int, ExecTarget]) -> float:
    """Seconds for one connect to every host plus one command round over those connections."""
    with NodeFleet(targets) as fleet:
        t0 = time.perf_counter()
        require_all(fleet.connect_all())
        require_all(fleet.run_all("true", timeout_s=60))
        return time.perf_counter() - t0


def engine_floor(jobs: Sequence[NodeJob], run: int) -> float:
    """Seconds for the least a launch does with these engines: one connect to every host, one round starting
    every node's engine (rank 0 first would only add time), then asking rank 0 every 20 ms until it serves;
    what it started is stopped. On one machine the engines' own start-up shares the cores with everything."""
    head = jobs[0]
    with NodeFleet({j.rank: j.target for j in jobs}) as fleet, NodeHttp(head.ready.url or "") as http:
        t0 = time.perf_counter()
        require_all(fleet.connect_all())
        by_rank = {j.rank: j for j in jobs}
        handles = require_all(fleet.map(lambda rank, ex: ex.start(
            by_rank[rank].command, by_rank[rank].log_path, tag=f"scalefloor.{rank}.{run}")))
        try:
            for _ in range(3000):  # 60 s at most
                if serving(http, head.ready.paths)[0]:
                    return time.perf_counter() - t0
                time.sleep(0.02)
            raise SystemExit("the engine floor: rank 0 did not serve within 60 s")
        finally:
            def stop(rank: int, ex: Executor) -> object:
                handle = handles[rank]
                return ex.terminate(handle, 5.0) if handle is not None else True

            fleet.map(stop)


def one_run(rig: HostRig, tmp: Path, n: int, run: int, watch_s: float) -> Sample:
    """Floor, launch, supervisor CPU and stop for the first n hosts."""
    cat = catalog_for(None)
    plan = require_feasible(_topology(rig, tmp, n, run), cat)
    jobs = jobs_for(plan, None, cat)
    floor = floor_round({j.rank: j.target for j in jobs})
    engines = engine_floor(jobs, run)
    store = StateStore(tmp / "state")
    t0 = time.perf_counter()
    dep = deploy.launch(plan, jobs, store)
    launched = time.perf_counter() - t0
    assert dep.status == "ready" and dep.owner is not None, dep.status
    log = store.directory / f"{plan.topology.name}.supervisor.log"
    for _ in range(600):  # its imports and connections are its start-up, not its watching: 60 s at most
        if log.exists() and "supervising" in log.read_text():
            break
        time.sleep(0.1)
    time.sleep(SETTLE_S)
    c0, w0 = _cpu_s(dep.owner.pid), time.perf_counter()
    time.sleep(watch_s)
    cpu = (_cpu_s(dep.owner.pid) - c0) / (time.perf_counter() - w0)
    t0 = time.perf_counter()
    final, outcome = deploy.stop(store, plan.topology.name)
    stopped = time.perf_counter() - t0
    if final.status != "stopped" or set(outcome.values()) != {"stopped"}:
        raise SystemExit(f"stop of {n} hosts: {final.status} {outcome}")
    return Sample(floor, engines, launched, stopped, cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,16,32", help=f"comma-separated host counts (of {sorted(PARALLEL)})")
    ap.add_argument("--runs", type=int, default=2, help="runs per size (median reported)")
    ap.add_argument("--watch-s", type=float, default=20.0, help="seconds the supervisor's CPU is measured")
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    results: dict[int, list[Sample]] = {n: [] for n in sizes}
    with HostRig(max(sizes)) as rig, tempfile.TemporaryDirectory(prefix="k3scale-") as tmpdir:
        tmp = Path(tmpdir)
        one_run(rig, tmp, sizes[0], 99, 0.5)  # warm-up: page cache, .pyc, sshd binaries
        for run in range(max(1, args.runs)):
            for n in sizes:
                results[n].append(one_run(rig, tmp, n, run, args.watch_s))
        leftovers = _leftovers(rig)
    med = {n: Sample(*(statistics.median(getattr(s, f) for s in results[n])
                       for f in ("floor_s", "engines_s", "launch_s", "stop_s", "supervisor_cpu"))) for n in sizes}
    print(f"{args.runs} runs per size, {os.cpu_count()} cores, medians:")
    print(f"{'hosts':>5}  {'floor':>8}  {'engines':>8}  {'launch':>8}  {'/floor':>7}  {'/engines':>9}  {'stop':>8}  "
          f"{'/floor':>7}  {'supervisor CPU':>15}")
    for n in sizes:
        m = med[n]
        print(f"{n:>5}  {m.floor_s:>7.2f}s  {m.engines_s:>7.2f}s  {m.launch_s:>7.2f}s  {m.launch_s / m.floor_s:>6.1f}x  "
              f"{m.launch_s / m.engines_s:>8.1f}x  {m.stop_s:>7.2f}s  {m.stop_s / m.floor_s:>6.1f}x  "
              f"{m.supervisor_cpu * 100:>13.1f}%")
    lo, hi = med[sizes[0]], med[sizes[-1]]
    print(f"{sizes[-1]} / {sizes[0]} hosts: floor {hi.floor_s / lo.floor_s:.2f}x, engines {hi.engines_s / lo.engines_s:.2f}x, launch {hi.launch_s / lo.launch_s:.2f}x, "
          f"stop {hi.stop_s / lo.stop_s:.2f}x (targets: launch and stop <= 1.5x, each <= 3x its floor; "
          "supervisor < 2% of a core)")
    if leftovers:
        print(f"LEFTOVER processes: {leftovers}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
