"""What `k3deploy plan` does on start beyond the work it needs: no pydantic plugin search (an entry-point scan
of every installed distribution), and the switch that skips it leaves the environment as it was."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3deploy.topology.base import no_pydantic_plugins

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = "topologies/h100-4x8-sglang.yaml"

# Counts pydantic's plugin searches: pydantic.plugin._loader binds entry_points when first imported, after this.
_COUNTING = """
import contextlib, importlib.metadata, io, sys
searches = []
real = importlib.metadata.entry_points
def counting(*args, **kwargs):
    if kwargs.get("group") == "pydantic":
        searches.append(1)
    return real(*args, **kwargs)
importlib.metadata.entry_points = counting
sys.argv = ["k3deploy"] + sys.argv[1:]
from k3deploy.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
in_plan = len(searches)
import pydantic
class Later(pydantic.BaseModel):
    x: int
print(in_plan, len(searches) - in_plan)
"""


def _searches(argv: list[str], cache: Path) -> tuple[int, int]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    run = subprocess.run([sys.executable, "-c", _COUNTING, *argv], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    in_plan, later = run.stdout.split()[-2:]
    return int(in_plan), int(later)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv", [["plan", TOPOLOGY], ["plan", TOPOLOGY, "--workload", "in=8192,out=1024,concurrency=16"],
                                  ["render", TOPOLOGY]])
def test_plan_searches_no_pydantic_plugins_with_a_cold_or_warm_catalog_cache(argv: list[str], tmp_path: Path) -> None:
    # The first run validates the catalog (a cold cache), the second takes it from the cache.
    assert _searches(argv, tmp_path) == (0, 1)
    assert _searches(argv, tmp_path) == (0, 1)  # ... and a model built afterwards still finds plugins


@pytest.mark.timeout(30)
@pytest.mark.parametrize("before", [None, "", "logfire"])
def test_the_switch_restores_what_was_set(before: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if before is None:
        monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", before)
    with pytest.raises(RuntimeError), no_pydantic_plugins():
        assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == "1"
        raise RuntimeError("a failed validation leaves the block too")
    assert os.environ.get("PYDANTIC_DISABLE_PLUGINS") == before


_COLLECTOR = """
import contextlib, gc, io, sys
sys.argv = ["k3deploy"] + sys.argv[1:]
from k3deploy.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
print(gc.isenabled())
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("argv", "collects"), [
    (["plan", TOPOLOGY], False), (["render", TOPOLOGY], False), (["schema"], False),
    (["status", "nothing-here", "--state-dir", str(ROOT / "no-such-state-dir")], True), (["--help"], True)])
def test_batch_commands_run_without_the_cycle_collector_and_others_keep_it(argv: list[str], collects: bool,
                                                                           tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", _COLLECTOR, *argv], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=100, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == str(collects)
