"""`k3deploy validate` over SSH on four network-namespace hosts, each with its own checkpoint copy at the same
path: a clean checkpoint passes; each seeded fault is caught by `shards` on its host with the file named;
--junit has one failing testcase per fault; nothing is left running on any host."""
from __future__ import annotations

from typing import Any

import pytest

from tests.integration.validate_rig import ROUNDS, RigNodes, check_clean, check_round
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig

pytestmark = pytest.mark.integration


def ssh_launch(rig: HostRig) -> dict[str, Any]:
    return {"executor": "ssh", "ssh": {"user": "root", "key": str(rig.key_path),
                                       "known_hosts": str(rig.known_hosts_path), "connect_timeout_s": 2}}


def hosts_empty(rig: HostRig) -> bool:
    """Nothing but the sshd master left in any host once the probes' sessions closed."""
    return wait_for(lambda: not any(rig.pids(h) for h in rig.hosts), 10.0)


@pytest.mark.timeout(120)
def test_a_clean_checkpoint_passes_on_every_host(nodes: RigNodes, rig4: HostRig) -> None:
    check_clean(nodes, ssh_launch(rig4), cli)
    assert hosts_empty(rig4)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("round_name", sorted(ROUNDS))
def test_each_fault_is_caught_on_its_host_with_the_file_named(nodes: RigNodes, rig4: HostRig, round_name: str) -> None:
    check_round(nodes, round_name, ssh_launch(rig4), cli)
    assert hosts_empty(rig4)
