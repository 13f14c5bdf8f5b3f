"""The fault matrix on the local executor with the fake engine: private files, secrets kept out of every
output, an unwritable or full state disk, two launches at once, Ctrl-C while waiting for ready. Each fault
ends with every node stopped (counted in the reliability figures)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from k3deploy.records.store import StateStore
from tests import figures
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
from tests.unit.test_launch_support import assert_nothing_left, fake_topology, tagged_pids

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_" + "Fz7q" * 9  # made up; must appear nowhere k3deploy writes or shows
UNSHARE = shutil.which("unshare")
needs_mounts = pytest.mark.skipif(os.geteuid() != 0 or UNSHARE is None,
                                  reason="a private tmpfs for the state directory needs root and unshare")


def k3(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return start_k3deploy(*args, env={"COLUMNS": "200", **(env or {})})


def done(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out, err


@pytest.fixture
def name(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A unique deployment name; afterwards none of its processes may run (counted if any do)."""
    dep = f"fault-{request.node.name.replace('_', '-')[5:30]}-{os.getpid() % 10000}"
    yield dep
    assert_nothing_left(dep, tmp_path / "state")


def modes(root: Path) -> dict[str, str]:
    """Octal mode of every file and folder under `root`, by relative path."""
    out = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = oct(stat.S_IMODE(p.stat().st_mode))
    return out


@pytest.mark.timeout(120)
def test_state_and_logs_are_private_and_a_secret_by_reference_leaks_nowhere(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    doc = yaml.safe_load(topo.read_text())
    doc["engine"]["secrets"] = {"HF_TOKEN": "env:K3_FAULT_SECRET"}
    topo.write_text(yaml.safe_dump(doc))
    env = {"K3_FAULT_SECRET": SECRET}
    code, out, err = done(k3("launch", str(topo), "--json", "--skip-preflight", env=env))
    assert code == 0, err
    running = tagged_pids(f"{name}.")
    cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in running]
    owner = StateStore(tmp_path / "state").require(name).owner
    assert owner is not None
    cmdlines.append(Path(f"/proc/{owner.pid}/cmdline").read_bytes().decode(errors="replace"))
    shown = [out, err]
    for args in (("status", str(topo), "--json"), ("status", str(topo)), ("render", str(topo)),
                 ("render", str(topo), "--format", "json"), ("launch", str(topo), "--dry-run", "--json"),
                 ("launch", str(topo), "--skip-preflight"), ("logs", str(topo)), ("stop", str(topo))):
        shown += list(done(k3(*args, env=env))[1:])
    files = {str(p): p.read_bytes().decode(errors="replace") for d in ("state", "logs")
             for p in (tmp_path / d).rglob("*") if p.is_file()}
    leaks = [t[:200] for t in shown + cmdlines + list(files.values()) if SECRET in t]
    figures.add(figures.SECRETS_LEAKED, len(leaks))
    assert leaks == []
    assert any("K3_FAULT_SECRET" in t for t in shown)  # the reference is shown, never its value
    for root in (tmp_path / "state", tmp_path / "logs"):
        for rel, mode in modes(root).items():
            is_dir = (root / rel).is_dir()
            assert mode == ("0o700" if is_dir else "0o600"), f"{root / rel}: {mode}"


@needs_mounts
@pytest.mark.parametrize("mount", ["ro", "size=4k"])
def test_an_unwritable_or_full_state_disk_is_a_state_error_and_starts_nothing(tmp_path: Path, name: str,
                                                                           mount: str) -> None:
    topo = fake_topology(tmp_path, name)
    state = tmp_path / "state"
    state.mkdir()
    fill = f"head -c 1M /dev/zero > {state}/filler 2>/dev/null; " if mount != "ro" else ""
    script = (f"mount -t tmpfs -o {mount},mode=700 tmpfs {state} && {fill}"
              f'exec "$0" -m k3deploy launch {topo}')
    figures.fault_injected()
    code, _, err = done(subprocess.Popen([str(UNSHARE), "-m", "sh", "-c", script, sys.executable], cwd=ROOT,
                                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    assert code == 5, err
    assert "Traceback" not in err and str(state) in err
    assert ("Read-only file system" if mount == "ro" else "No space left on device") in err
    assert tagged_pids(f"{name}.") == []
    assert not (state / f"{name}.json").exists()  # the mount was private: nothing half-written out here


def test_two_launches_at_the_same_moment_exactly_one_proceeds(tmp_path: Path, name: str) -> None:
    topo = fake_topology(tmp_path, name)
    figures.fault_injected()
    procs = [k3("launch", str(topo), "--skip-preflight") for _ in range(2)]
    results = sorted(done(p)[0:3:2] for p in procs)
    assert [c for c, _ in results] == [0, 5], results
    assert "already" in results[1][1] and f"k3deploy stop {name}" in results[1][1]
    rec = json.loads(done(k3("status", str(topo), "--json"))[1])
    assert rec["status"] == "ready" and rec["supervised"] is True
    assert done(k3("stop", str(topo)))[0] == 0
    assert tagged_pids(f"{name}.") == []


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's reaper here may be slow)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stalling_mv(tmp_path: Path, name: str, ranks: list[int]) -> tuple[dict[str, str], Path]:
    """A slow host for the local executor: a start moves an earlier log aside (`mv`), and for these ranks
    that `mv` stalls (writing its PID to the returned file first) until something ends its session."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    for rank in ranks:
        (logs / f"{name}-rank{rank}.log").write_text("an earlier run\n")
    shim, gate = tmp_path / "bin", tmp_path / "stalled.pid"
    shim.mkdir()
    pattern = "|".join(f"*/{name}-rank{r}.log.1" for r in ranks)
    (shim / "mv").write_text(f'#!/bin/sh\ncase "$3" in {pattern}) echo $$ > {gate}; sleep 600;; esac\n'
                             'exec /bin/mv "$@"\n')
    (shim / "mv").chmod(0o755)
    return {"PATH": f"{shim}:{os.environ['PATH']}"}, gate


@pytest.mark.parametrize("phase", ["starting the head", "starting the workers", "waiting for ready"])
def test_ctrl_c_stops_every_started_node_and_exits_130(tmp_path: Path, name: str, phase: str) -> None:
    # The Ctrl-C lands where the phase says, on a machine of any speed: while a start stalls on its host
    # (the others started or not), or while rank 0 takes 60 s to serve.
    delay = "60" if phase == "waiting for ready" else "0"
    topo = fake_topology(tmp_path, name, env={"FAKE_READY_DELAY_S": delay}, launch={"ready_timeout_s": 120})
    stalled = {"starting the head": [0], "starting the workers": [1, 2, 3], "waiting for ready": []}[phase]
    env, gate = stalling_mv(tmp_path, name, stalled)
    proc = k3("launch", str(topo), "--skip-preflight", env=env)
    expected = {"starting the head": 0, "starting the workers": 1, "waiting for ready": 4}[phase]
    if stalled:
        assert wait_for(gate.exists, 60), "no start stalled"
    assert wait_for(lambda: len(tagged_pids(f"{name}.")) >= expected, 60), "nothing started"
    figures.fault_injected()
    proc.send_signal(signal.SIGINT)
    code, _, err = done(proc, timeout_s=120)
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert wait_for(lambda: tagged_pids(f"{name}.") == [], 30), tagged_pids(f"{name}.")
    if stalled:  # the stalled start was ended with the launch: it can never start its node later
        assert wait_for(lambda: not running(int(gate.read_text())), 30)
    rec = json.loads(done(k3("status", str(topo), "--json"))[1])
    assert rec["status"] in ("failed", "stopped") and rec["supervised"] is False
