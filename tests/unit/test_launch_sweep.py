"""A test run killed mid-test (SIGTERM, as `timeout` sends) leaves none of its local deployments running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from k3deploy.records.store import StateStore
from tests.polling import wait_for
from tests.unit.test_launch_support import stop_left, tagged_pids

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]

# Launches a fake deployment, says so, and hangs until killed: a test interrupted mid-run.
HANGING = '''
import time
from pathlib import Path
from tests import sweep
from tests.unit.test_launch_local import launch_lib
from tests.unit.test_launch_support import fake_topology

def test_hangs(tmp_path):
    sweep.STARTED[{name!r}] = Path({state!r})
    launch_lib(fake_topology(tmp_path, {name!r}, launch={{"state_dir": {state!r}}}))
    Path({mark!r}).write_text("launched")
    time.sleep(300)
'''


def test_sigterm_mid_test_stops_the_sessions_deployments(tmp_path: Path) -> None:
    name, state, mark = f"ut-sweep-{os.getpid() % 10000}", tmp_path / "state", tmp_path / "launched"
    (tmp_path / "t").mkdir()
    test_file = tmp_path / "t" / "test_hanging.py"
    test_file.write_text(HANGING.format(name=name, state=str(state), mark=str(mark)))
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.sweep",
                              str(test_file)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: mark.exists() or child.poll() is not None, 120), "the hanging test never launched"
        assert mark.exists(), child.communicate()[0]
        owner = StateStore(state).require(name).owner
        assert owner is not None and owner.alive() and tagged_pids(f"{name}.") != []  # running before the kill
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == -signal.SIGTERM  # it still dies of the signal
        assert tagged_pids(f"{name}.") == [] and wait_for(lambda: not owner.alive(), 30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        stop_left(name, state)
