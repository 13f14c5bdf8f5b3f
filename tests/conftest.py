"""Shared test setup: the repo root on sys.path, a tiny checkpoint per test module, and the figures summary."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from k3deploy.checkpoint.manifest import Manifest

# Stand-in nodes join their group over plain TCP (k3deploy/sim/socket_group.py) unless a test asks for Gloo:
# importing torch costs each node about 3 s of CPU, and the suite starts over a thousand nodes to test what
# surrounds the engine. The tests of the Gloo group itself, one launch per launcher, and the real-engine tier
# (scripts/real_tier.sh) set K3SIM_GROUP=gloo. Stand-ins on the SSH rig get it from their sshd (tests/rig/sshd.py).
os.environ.setdefault("K3SIM_GROUP", "tcp")

# Local deployments a killed run would leave orphaned are stopped at session end and on SIGTERM.
pytest_plugins = ["tests.sweep"]


@pytest.fixture(scope="module")
def checkpoint_manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    """A kimi-k3-tiny checkpoint (the stand-in's, folder named as the model) and its manifest; one per test
    module, so a module that damages its copy harms no other."""
    from k3deploy.sim.checkpoint import write_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "kimi-k3-tiny"
    return path, write_checkpoint(path)


@pytest.fixture(scope="session")
def vllm_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One VLLM_CACHE_ROOT for every real vLLM the run starts (tests/realengine, tests/integration/*real_vllm*).
    With --enforce-eager the only thing vLLM keeps there is its registry's model-class info (modelinfos/,
    keyed by the model module's hash, written atomically): an empty cache makes every start inspect the
    class in an extra Python that imports vLLM and torch (58 of 170 s of a start on the loaded machine),
    which a user's ~/.cache/vllm pays once. A second start finds it, as a user's does."""
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="module")
def checkpoint(checkpoint_manifest: tuple[Path, Manifest]) -> Path:
    """The module's kimi-k3-tiny checkpoint folder."""
    return checkpoint_manifest[0]


# The unit tier also runs under Python 3.10 (scripts/py310_units.sh) in a venv without torch: the only torch
# wheel on these machines is for 3.11. Tests marked `torch` skip there; they run under the main venv.
HAS_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = ("needs torch, which this venv lacks (the Python 3.10 unit run installs every extra but torch: "
            "its only wheel here is for 3.11); it runs under the main venv")


def pytest_configure(config: pytest.Config) -> None:
    """One fuzz seed for the whole run, in the environment so every process of it (xdist workers) shares it."""
    from tests import fuzz_seed

    os.environ.setdefault("K3_FUZZ_SEED", str(fuzz_seed.SEED))


def pytest_report_header(config: pytest.Config) -> str:
    from tests import fuzz_seed

    return fuzz_seed.replay_line()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The run's order (tests/schedule.py: longest modules first, each module one xdist group), and the tests
    that need torch skipped, with the reason, where torch is not installed."""
    from tests import schedule
    from tests.realengine.tier_time import note_items

    note_items(items)
    schedule.order(items)
    if HAS_TORCH:
        return
    for item in items:
        if item.get_closest_marker("torch") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_TORCH))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    from tests.realengine.tier_time import note_report

    note_report(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """An xdist worker hands its figures and its real-engine times to the controller, which prints them."""
    from tests.realengine import tier_time

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests import figures

        workeroutput["k3deploy_figures"] = dict(figures.FIGURES)
        workeroutput["k3deploy_tier_s"] = dict(tier_time.SPENT_S)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each group of tests/schedule.py (a module, or the modules that start Ray clusters) on one worker."""
    from tests import schedule

    return schedule.scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller adds up what each xdist worker counted (pytest_sessionfinish above)."""
    from tests import figures
    from tests.realengine import tier_time

    out = getattr(node, "workeroutput", {})
    figures.FIGURES.update(out.get("k3deploy_figures", {}))
    tier_time.SPENT_S.update(out.get("k3deploy_tier_s", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the reliability figures the tests gathered (tests/figures.py) and the real-engine tier's time
    (tests/realengine/tier_time.py), once, at the end of the run."""
    from tests.figures import summary_lines
    from tests.realengine import tier_time

    terminalreporter.section("k3deploy reliability figures")
    from tests import fuzz_seed

    for line in summary_lines() + tier_time.summary_lines() + [fuzz_seed.replay_line()]:
        terminalreporter.write_line(line)
