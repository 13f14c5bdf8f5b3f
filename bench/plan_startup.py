"""Wall time of `k3deploy plan` against bare `import typer, pydantic, yaml, rich`, in one run.

Usage: python bench/plan_startup.py [--runs N] [--topology FILE] [--workload SPEC]
Runs the commands alternately (so machine noise hits each alike) and prints medians and ratios.
Target: within 1.5x of the baseline, for `plan FILE` and for `plan FILE --workload SPEC` (the prediction).

Two floors are timed in the same run (bench/plan_floor.py): the least a plan-like command can do with the
mandated stack - read the YAML, validate it into one strict pydantic model, print one rich table - parsed
with argparse, and with a one-command typer app. The baseline imports typer and pydantic lazily and so
pays none of the work they do when used; the floors show what that work costs before any k3deploy code.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = ROOT / "bench" / "plan_floor.py"


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, timeout=120)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--topology", default=str(ROOT / "topologies" / "h100-4x8-sglang.yaml"))
    ap.add_argument("--workload", default="in=8192,out=1024,concurrency=16,effort=high")
    args = ap.parse_args()
    cmds = {
        "baseline  import typer, pydantic, yaml, rich": [sys.executable, "-c", "import typer, pydantic, yaml, rich"],
        "floor     argparse + 1 model + 1 rich table": [sys.executable, str(FLOOR), args.topology],
        "floor     typer + 1 model + 1 rich table": [sys.executable, str(FLOOR), "--typer", args.topology],
        f"k3deploy plan {Path(args.topology).name}": [sys.executable, "-m", "k3deploy", "plan", args.topology],
        "k3deploy plan ... --workload": [sys.executable, "-m", "k3deploy", "plan", args.topology, "--workload",
                                         args.workload],
    }
    # An installed package has its bytecode compiled (pip does it); an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile every module on every run, so compile it once here.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "k3deploy")], check=True, timeout=300)
    for argv in cmds.values():
        _time(argv)  # warm the page cache
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.runs):
        for name, argv in cmds.items():
            times[name].append(_time(argv))
    med = {name: statistics.median(t) for name, t in times.items()}
    base = next(iter(med.values()))
    for name, m in med.items():
        print(f"{name:<46}: median {m * 1000:7.1f} ms  {m / base:5.2f}x  (n={args.runs})")
    plan, with_workload = list(med.values())[-2:]
    floor = list(med.values())[1]
    print(f"ratio plan / baseline: {plan / base:.2f}x  (target <= 1.50x); "
          f"floor / baseline: {floor / base:.2f}x; plan / floor: {plan / floor:.2f}x")
    print(f"ratio plan --workload / baseline: {with_workload / base:.2f}x  (target <= 1.50x); "
          f"plan --workload / plan: {with_workload / plan:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
