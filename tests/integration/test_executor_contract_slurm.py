"""The executor contract (tests/executor_contract.py) against the Slurm executor: a node of a real
allocation on the Slurm rig, every command a job step (`srun --overlap`)."""
from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.executors.target import SlurmTarget
from tests.contract_node import ContractNode, http_server
from tests.executor_contract import *  # the shared behaviour tests
from tests.rig import HostRig
from tests.rig.slurm_cluster import SlurmRig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slurm_cluster,
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="slurm-wlm is not installed "
                       "(scripts/test.sh installs slurmctld slurmd slurm-client munge)"),
]


@pytest.fixture(scope="module")
def allocation(slurm: SlurmRig) -> Iterator[tuple[HostRig, SlurmRig, int]]:
    """Two nodes of the run's Slurm cluster held for the module (a job without a shell), released after it."""
    rig = slurm.rig
    got = slurm.client(["salloc", "--no-shell", "--nodes=2", f"--nodelist={rig.hosts[0].name},{rig.hosts[1].name}",
                        "--job-name=contract"], timeout_s=120)
    found = re.search(r"job allocation (\d+)", got.stderr)
    assert found, got.stderr + slurm.log("slurmctld")
    job = int(found.group(1))
    yield rig, slurm, job
    slurm.client(["scancel", str(job)])


@pytest.fixture
def node(allocation: tuple[HostRig, SlurmRig, int], tmp_path: Path) -> ContractNode:
    rig, slurm, job = allocation
    host = rig.hosts[1]
    enter = ["nsenter", "--target", str(rig.sshd_pid(host)), "--pid", "--mount", "--uts", "--net", "--"]
    tmp_path.chmod(0o755)
    target = SlurmTarget(host=host.name, job_id=job, slurm_conf=str(slurm.conf_path))
    return ContractNode(kind="slurm", target=target, scratch=tmp_path, node_ip=host.priv_ip,
                        serve_http=lambda ip, port: http_server(ip, port, host.name, enter))
