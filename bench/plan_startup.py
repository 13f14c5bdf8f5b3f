"""Wall time of `k3deploy plan` against bare `import typer, pydantic, yaml, rich`, in one run.

Usage: python bench/plan_startup.py [--runs N] [--topology FILE]
Runs both commands alternately (so machine noise hits both alike) and prints medians and the ratio.
Target: within 1.5x of the baseline.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT, timeout=120)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--topology", default=str(ROOT / "topologies" / "h100-4x8-sglang.yaml"))
    args = ap.parse_args()
    base_cmd = [sys.executable, "-c", "import typer, pydantic, yaml, rich"]
    plan_cmd = [sys.executable, "-m", "k3deploy", "plan", args.topology]
    # An installed package has its bytecode compiled (pip does it); an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile every module on every run, so compile it once here.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "k3deploy")], check=True, timeout=300)
    _time(base_cmd), _time(plan_cmd)  # warm the page cache
    base, plan = [], []
    for _ in range(args.runs):
        base.append(_time(base_cmd))
        plan.append(_time(plan_cmd))
    b, p = statistics.median(base), statistics.median(plan)
    print(f"baseline  import typer, pydantic, yaml, rich : median {b * 1000:7.1f} ms  (n={args.runs})")
    print(f"k3deploy plan {Path(args.topology).name:<28}: median {p * 1000:7.1f} ms  (n={args.runs})")
    print(f"ratio plan / baseline: {p / b:.2f}x  (target <= 1.50x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
