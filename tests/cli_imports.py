"""Which modules a CLI run imports, asked in a fresh interpreter (the path and --help must stay light)."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_by(argv: Sequence[str], watched: Sequence[str]) -> list[str]:
    """The `watched` modules in sys.modules after `k3deploy ARGV` ran (its output swallowed)."""
    code = ("import sys, io, contextlib\n"
            f"sys.argv = ['k3deploy'] + {list(argv)!r}\n"
            "from k3deploy.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main()\n    except SystemExit:\n        pass\n"
            f"print(sorted(m for m in {list(watched)!r} if m in sys.modules))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=False)
    last = run.stdout.strip().splitlines()[-1:] or ["<no output>"]
    assert last[0].startswith("["), run.stdout + run.stderr
    return list(eval(last[0]))
