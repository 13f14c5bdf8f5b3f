#!/usr/bin/env python3
"""Write tests/durations.json, the per-module seconds tests/schedule.py orders a run by, from the JUnit XML of
one or more runs (`pytest --junitxml=F`): each module's setup, call and teardown time added up (a later file
wins for a module it names). Usage: scripts/test_durations.py RUN.xml [RUN.xml ...]"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from junitparser import JUnitXml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def module_path(classname: str) -> str | None:
    """`tests.unit.test_x.TestY` -> `tests/unit/test_x.py` (the longest dotted prefix that is a file)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        rel = "/".join(parts[:n]) + ".py"
        if (ROOT / rel).is_file():
            return rel
    return None


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    modules: dict[str, float] = {}
    for path in paths:
        run: dict[str, float] = {}
        for suite in JUnitXml.fromfile(path):
            for case in suite:
                rel = module_path(case.classname or "")
                if rel is not None:
                    run[rel] = run.get(rel, 0.0) + float(case.time or 0.0)
        modules.update(run)
    doc = {"about": "seconds per test module in a measured run (scripts/test_durations.py); tests/schedule.py "
                    "runs the longest first",
           "modules": {k: round(v, 1) for k, v in sorted(modules.items(), key=lambda kv: -kv[1])}}
    OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT.relative_to(ROOT)}: {len(modules)} modules, {sum(modules.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
