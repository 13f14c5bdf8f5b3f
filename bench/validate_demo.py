"""`k3deploy validate` of the local demo (every implemented stage) beside the demo's own launch, in one run.

Usage: python bench/validate_demo.py
Copies topologies/local-demo.yaml with its own checkpoint, log and state directories and free ports (so it
never meets a demo someone else runs), makes the tiny checkpoint, then times `launch`, `validate` and
`stop` through the CLI. Target: validate within 3x the launch time. Prints each stage's time and detail.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout_s: float = 600) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "k3deploy", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT, check=False)
    return done, time.monotonic() - t0


def main() -> int:
    """Launch, validate, stop; print the times; exit 1 when a stage fails or the target is missed."""
    from k3deploy.sim.checkpoint import write_checkpoint

    with tempfile.TemporaryDirectory(prefix="k3-validate-demo-") as tmp_dir:
        tmp = Path(tmp_dir)
        doc = yaml.safe_load((ROOT / "topologies" / "local-demo.yaml").read_text())
        doc["name"] = f"bench-validate-demo-{_free_port()}"
        doc["model"]["path"] = str(tmp / "kimi-k3-tiny")
        doc["engine"]["port"] = _free_port()
        doc["launch"].update(port=_free_port(), log_dir=str(tmp / "logs"), state_dir=str(tmp / "state"))
        topology = tmp / "demo.yaml"
        topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        write_checkpoint(tmp / "kimi-k3-tiny")
        launched, launch_s = _cli("launch", str(topology))
        if launched.returncode != 0:
            print(launched.stdout + launched.stderr)
            return 1
        try:
            checked, validate_s = _cli("validate", str(topology), "--json")
        finally:
            _cli("stop", str(topology))
    report = json.loads(checked.stdout)
    print(f"launch   {launch_s:6.1f} s")
    print(f"validate {validate_s:6.1f} s ({validate_s / launch_s:.2f}x launch; target <= 3x), exit {checked.returncode}")
    for stage in report["stages"]:
        print(f"  {stage['name']:<13} {stage['status']:<5} {stage['seconds']:6.1f} s  {stage['detail'][:150]}")
    if report["not_implemented"]:
        print(f"  not implemented here: {', '.join(report['not_implemented'])}")
    return 0 if report["passed"] and validate_s <= 3 * launch_s else 1


if __name__ == "__main__":
    sys.exit(main())
