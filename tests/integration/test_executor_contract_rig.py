"""The executor contract (tests/executor_contract.py) against SSH and Ray on the namespace rig, and an
HTTP request to rank 0 from the rig's login-node namespace, which cannot reach the private network."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.executors.target import RayTarget, SshTarget
from tests.contract_node import ContractNode, http_server
from tests.executor_contract import *  # the shared behaviour tests
from tests.integration.sim_deployments import ROOT, kill_agents
from tests.rig import HostRig
from tests.rig.ray_cluster import RayRig

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]


def _enter(rig: HostRig, host: str) -> list[str]:
    return ["nsenter", "--target", str(rig.sshd_pid(host)), "--pid", "--mount", "--uts", "--net", "--"]


@pytest.fixture(scope="module")
def rig2() -> Iterator[HostRig]:
    if os.geteuid() != 0:
        pytest.skip("the multi-host rig needs root (network namespaces)")
    with HostRig(2) as rig:
        yield rig


@pytest.fixture(params=["ssh", "ray"])
def node(request: pytest.FixtureRequest, rig2: HostRig, tmp_path: Path) -> Iterator[ContractNode]:
    """A node over SSH (the module's two-host rig) or through Ray (the run's Ray cluster, ray4): its second host.
    Over Ray, the agents the test's executors kept are killed after it: an executor keeps an agent until it
    has seen its process group gone (as a deployment's lives until `stop`), and some contract tests end before
    that (a process that ended by itself, a foreign tag). Their groups' watchdogs must then stop what is left:
    the shared cluster's check (tests/integration/conftest.py: left_nothing) fails on any tagged process."""
    rig = rig2
    host = rig2.hosts[1]
    if request.param == "ssh":
        target = SshTarget(host=host.name, ssh_config=str(rig2.ssh_config_path),
                            known_hosts=str(rig2.known_hosts_path))
    else:
        cluster: RayRig = request.getfixturevalue("ray4")  # this process is its Ray driver
        rig = cluster.rig
        host = rig.hosts[1]
        target = RayTarget(host=host.name, node_ip=host.priv_ip, ray_address=cluster.address)
    tmp_path.chmod(0o755)
    yield ContractNode(kind=request.param, target=target, scratch=tmp_path, node_ip=host.priv_ip,
                       serve_http=lambda ip, port: http_server(ip, port, host.name, _enter(rig, host.name)))
    if request.param == "ray":
        kill_agents(rig)


@pytest.mark.timeout(120)
def test_http_to_rank_0_from_a_login_node_goes_through_an_ssh_tunnel(rig2: HostRig, free_port: int) -> None:
    """From the controller namespace (management network only) a server on h01's private address answers
    through h01's sshd (direct-tcpip), and not directly."""
    h01 = rig2.hosts[0]
    stop = http_server(h01.priv_ip, free_port, h01.name, _enter(rig2, h01.name))
    code = (
        "import sys\n"
        "from k3deploy.executors.http import NodeHttp\n"
        "from k3deploy.executors.ssh import SshExecutor\n"
        "from k3deploy.executors.target import SshTarget\n"
        "from tests.polling import wait_for\n"
        "url, mgmt, cfg, kh, key = sys.argv[1:6]\n"
        "ex = SshExecutor(SshTarget(host=mgmt, user='root', key=key, known_hosts=kh, ssh_config=cfg))\n"
        "with NodeHttp(url, timeout_s=2) as direct:\n"
        "    try:\n"
        "        direct.get('/direct'); print('direct answered')\n"
        "    except Exception as exc:\n"
        "        print('direct failed:', type(exc).__name__)\n"
        "with NodeHttp(url, via=ex) as http:\n"
        "    assert wait_for(lambda: http.get('/up').ok, 20)\n"
        "    print(http.route, http.get('/through').text)\n"
        "ex.close()\n"
    )
    try:
        run = subprocess.run(["ip", "netns", "exec", rig2.controller(), sys.executable, "-c", code,
                              f"http://{h01.priv_ip}:{free_port}", h01.mgmt_ip, str(rig2.ssh_config_path),
                              str(rig2.known_hosts_path), str(rig2.key_path)], capture_output=True, text=True, timeout=90, cwd=ROOT,
                             check=False)
    finally:
        stop()
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "direct failed: HttpFailure", run.stdout
    assert lines[1] == f'forwarded {{"path": "/through", "served_by": "{h01.name}"}}', run.stdout
