"""A pytest run started with SIGINT ignored (as a script's background job is) still ends on SIGINT, tearing its
fixtures down: tests/sweep.py puts Python's handler back. scripts/real_tier.sh stops its two runs that way."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)

BODY = '''
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def engine():
    yield
    (HERE / "torn-down").write_text("yes")


def test_waits(engine):
    (HERE / "started").write_text("yes")
    time.sleep(90)
'''


def test_sigint_ends_a_run_that_came_in_with_sigint_ignored(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(BODY)
    # `trap "" INT` then exec: SIGINT ignored on entry, as a script's `cmd &` leaves it.
    run = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.sweep", "--rootdir", str(tmp_path), str(tmp_path / "test_slow.py")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: (tmp_path / "started").exists() or run.poll() is not None, 120), "never started"
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)  # the test sleeps 90 s: only the handler ends it sooner
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)
    assert run.returncode == 2, out.decode(errors="replace")[-2000:]  # pytest's "interrupted"
    assert (tmp_path / "torn-down").read_text() == "yes"
