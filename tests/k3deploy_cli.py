"""`python -m k3deploy ARGS` as the tests run it: from the repository root, output captured as text."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def k3deploy_argv(*args: str | Path, prefix: Sequence[str] = ()) -> list[str]:
    """The command line (`prefix` first, e.g. `ip netns exec NS` to run it inside a namespace)."""
    return [*prefix, sys.executable, "-m", "k3deploy", *map(str, args)]


def _environ(env: Mapping[str, str] | None, environ: Mapping[str, str] | None) -> dict[str, str]:
    return {**(os.environ if environ is None else environ), **(env or {})}


def run_k3deploy(*args: str | Path, timeout_s: float = 120, env: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None,
                 prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run to its end; `env` is added to this process's environment, or to `environ` when given."""
    return subprocess.run(k3deploy_argv(*args, prefix=prefix), capture_output=True, text=True, check=False,
                          timeout=timeout_s, cwd=ROOT, env=_environ(env, environ))


def start_k3deploy(*args: str | Path, env: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start in the background, stdout and stderr piped (the caller waits for it or kills it)."""
    return subprocess.Popen(k3deploy_argv(*args), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_environ(env, environ))
