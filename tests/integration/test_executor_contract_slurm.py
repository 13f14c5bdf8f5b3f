"""The executor contract (tests/executor_contract.py) against the Slurm executor: a node of a real
allocation on the Slurm rig, every command a job step (`srun --overlap`)."""
from __future__ import annotations

import os
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
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="slurm-wlm is not installed "
                       "(scripts/test.sh installs slurmctld slurmd slurm-client munge)"),
]


@pytest.fixture(scope="module")
def allocation() -> Iterator[tuple[HostRig, SlurmRig, int]]:
    if os.geteuid() != 0:
        pytest.skip("the Slurm rig needs root (network namespaces)")
    with HostRig(2) as rig, SlurmRig(rig) as slurm:
        got = slurm.client(["salloc", "--no-shell", "--nodes=2", "--job-name=contract"], timeout_s=120)
        found = re.search(r"job allocation (\d+)", got.stderr)
        assert found, got.stderr + slurm.log("slurmctld")
        yield rig, slurm, int(found.group(1))


@pytest.fixture
def node(allocation: tuple[HostRig, SlurmRig, int], tmp_path: Path) -> ContractNode:
    rig, slurm, job = allocation
    host = rig.hosts[1]
    enter = ["nsenter", "--target", str(rig.sshd_pid(host)), "--pid", "--mount", "--uts", "--net", "--"]
    tmp_path.chmod(0o755)
    target = SlurmTarget(host=host.name, job_id=job, slurm_conf=str(slurm.conf_path))
    return ContractNode(kind="slurm", target=target, scratch=tmp_path, node_ip=host.priv_ip,
                        serve_http=lambda ip, port: http_server(ip, port, host.name, enter))
