"""Fixtures for integration tests: fake multi-host rigs (network namespaces + sshd), root only.

The rigs are shared by a whole run (session scope; under xdist, per worker): four SSH hosts, a Ray cluster on
four hosts of its own and a Slurm cluster on four of its own (tests/schedule.py puts every module that uses a
cluster in one group, so each is built once a run). A module says which one its `rig4` is by a mark:
`pytest.mark.ray_cluster` or `pytest.mark.slurm_cluster` (else the SSH hosts). Every test that used one is
checked afterwards for what it left there (`left_nothing` below): processes on the SSH hosts, k3deploy's
processes and agent actors on the Ray hosts, jobs in the Slurm queue; what it left is removed, so the next
test starts clean, and the test fails naming it. The clusters go at the session's end (pytest tears down
session fixtures on Ctrl-C too; each rig's atexit and its registry catch a killed run).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# `tests.rig` is imported as a package from the repo root, whatever way pytest was started.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.integration.sim_deployments import (
    Deployments,
    RayDeployments,
    SimDeployments,
    agents,
    hosts_empty,
    nothing_left,
    remove_from_ray_hosts,
    tagged,
)
from tests.integration.ssh_faults import SecondSshd
from tests.integration.validate_rig import RigNodes
from tests.polling import wait_for
from tests.readme_text import ReadmeInstall, install_as_readme_says
from tests.rig import HostRig
from tests.rig.ray_cluster import RAY_ENV, RayRig
from tests.rig.slurm_cluster import SlurmRig

NEEDS_ROOT = "the multi-host rig needs root (network namespaces)"


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)


def named_rig(prefix: str, hosts: int = 4) -> Iterator[HostRig]:
    """A rig whose namespaces carry `prefix`, apart from other modules' rigs (for a module-scoped fixture)."""
    _require_root()
    with HostRig(hosts, prefix=prefix) as rig:
        yield rig


@pytest.fixture
def root_only() -> None:
    """Skip the test unless running as root."""
    _require_root()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray_cluster: the module's rig4 is the run's Ray cluster's hosts (ray4)")
    config.addinivalue_line("markers", "slurm_cluster: the module's rig4 is the run's Slurm cluster's hosts (slurm)")


@pytest.fixture(scope="session")
def ssh_rig4() -> Iterator[HostRig]:
    """Four SSH hosts h01..h04 for the whole run (per xdist worker)."""
    _require_root()
    with HostRig(4) as rig:
        yield rig


@pytest.fixture(scope="session")
def ray4() -> Iterator[RayRig]:
    """A Ray cluster on four hosts of its own (one Ray node each, plus the driver node), for the whole run:
    ~25-50 s to start on 2 cores, paid once. This process is a Ray driver while it lasts."""
    _require_root()
    saved = dict(os.environ)
    os.environ.update(RAY_ENV)
    try:
        with HostRig(4, prefix="kray") as rig, RayRig(rig) as cluster:
            yield cluster
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmRig]:
    """A Slurm cluster (slurmctld here, a slurmd on each of four hosts of its own) for the whole run."""
    _require_root()
    if shutil.which("slurmctld") is None:
        pytest.skip("slurm-wlm is not installed (scripts/test.sh installs slurmctld slurmd slurm-client munge)")
    with HostRig(4, prefix="kslm") as rig, SlurmRig(rig) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def rig4(request: pytest.FixtureRequest) -> HostRig:
    """The module's four hosts: the Ray cluster's in a module marked ray_cluster, the Slurm cluster's in one
    marked slurm_cluster, else the run's SSH hosts."""
    if request.node.get_closest_marker("ray_cluster") is not None:
        cluster: RayRig = request.getfixturevalue("ray4")
        return cluster.rig
    if request.node.get_closest_marker("slurm_cluster") is not None:
        return request.getfixturevalue("slurm").rig  # type: ignore[no-any-return]
    return request.getfixturevalue("ssh_rig4")  # type: ignore[no-any-return]


@pytest.fixture
def deployments(request: pytest.FixtureRequest, rig4: HostRig, checkpoint: Path,
                tmp_path: Path) -> Iterator[SimDeployments]:
    """Stand-in topologies for the module's hosts (over Ray in a module marked ray_cluster, else over SSH);
    afterwards every one still running is stopped, and the test fails if any was (or left a process)."""
    if request.node.get_closest_marker("ray_cluster") is not None:
        d: SimDeployments = RayDeployments(rig4, request.getfixturevalue("ray4"), checkpoint, tmp_path)
    else:
        d = Deployments(rig4, checkpoint, tmp_path)
    yield d
    problems = d.cleanup()
    assert problems == [], problems


@pytest.fixture(scope="module")
def nodes(rig4: HostRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigNodes]:
    """Each of the module's hosts with its own checkpoint copy at one path (tests/integration/validate_rig.py);
    unbound when the module is done."""
    made = RigNodes(rig4, tmp_path_factory.mktemp("validate"))
    yield made
    made.unbind()


@pytest.fixture
def sshd2(rig4: HostRig, tmp_path: Path) -> Iterator[SecondSshd]:
    """A second, killable sshd on h03 (rank 2 of the deployments here); gone after the test."""
    d = SecondSshd(rig4, rig4.hosts[2], tmp_path)
    d.start()
    yield d
    d.kill()


@pytest.fixture(autouse=True)
def left_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used a shared rig: nothing of it left there (what is, is removed and named)."""
    # Fixtures of a wider scope are made before this one: a job a module holds (tests/integration/
    # test_executor_contract_slurm.py's allocation) is in the queue before the test.
    held = set(_slurm_jobs(request.getfixturevalue("slurm"))) if "slurm" in request.fixturenames else set()
    yield
    if "rig4" not in request.fixturenames and "ray4" not in request.fixturenames \
            and "slurm" not in request.fixturenames:
        return
    problems: list[str] = []
    if "ray4" in request.fixturenames:
        rig = request.getfixturevalue("ray4").rig
        if not nothing_left(rig):
            left = {h.name: [*map(str, tagged(rig, h.name)), *agents(rig, h.name)] for h in rig.hosts}
            problems.append(f"on the Ray hosts: {left}")
            remove_from_ray_hosts(rig)
    if "slurm" in request.fixturenames:
        cluster: SlurmRig = request.getfixturevalue("slurm")
        if not wait_for(lambda: not set(_slurm_jobs(cluster)) - held, 60, step_s=1):
            left = {job: state for job, state in _slurm_jobs(cluster).items() if job not in held}
            problems.append(f"jobs in the Slurm queue: {left}")
            cluster.client(["scancel", "--full", *left])
        idle = {h.name: "idle" for h in cluster.rig.hosts}
        if not held and not wait_for(lambda: cluster.node_states() == idle, 60, step_s=1):
            problems.append(f"Slurm nodes not idle: {cluster.node_states()}")
            for h in cluster.rig.hosts:
                cluster.client(["scontrol", "update", f"nodename={h.name}", "state=resume"])
    on_cluster = request.node.get_closest_marker("ray_cluster") or request.node.get_closest_marker("slurm_cluster")
    if "rig4" in request.fixturenames and not on_cluster:
        rig = request.getfixturevalue("rig4")
        if not hosts_empty(rig, 15.0):
            problems.append(f"processes on the SSH hosts: {({h.name: rig.pids(h) for h in rig.hosts})}")
            for h in rig.hosts:
                rig.kill_host_processes(h)
    assert not problems, f"{request.node.nodeid} left behind " + "; ".join(problems)


def _slurm_jobs(cluster: SlurmRig) -> dict[str, str]:
    """The queue: job ID -> state."""
    rows = cluster.client(["squeue", "-h", "-o", "%i %T"]).stdout.split("\n")
    return dict(row.split(None, 1) for row in rows if row.strip())  # type: ignore[misc]


@pytest.fixture(scope="session")
def readme_install(tmp_path_factory: pytest.TempPathFactory) -> ReadmeInstall:
    """README's install command run once a run (tests/readme_text.py): test_readme_install.py checks what it
    did, test_core_install.py runs every command from the venv it made (tests/schedule.py puts both modules on
    one worker)."""
    return install_as_readme_says(tmp_path_factory.mktemp("readme"))


@pytest.fixture
def make_rig() -> Iterator[Callable[..., HostRig]]:
    """Factory `make_rig(n, **kwargs)`; every rig it made is closed after the test."""
    _require_root()
    made: list[HostRig] = []

    def make(n: int, **kwargs: Any) -> HostRig:
        rig = HostRig(n, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in reversed(made):
        rig.close()
