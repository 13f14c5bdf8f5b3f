"""`k3deploy launch` over SSH on the namespace rig refused before anything starts: an unreachable host (exit 3
within the connect deadline), a wrong interface or ip on one node (exit 4, the node and what it has named),
an unknown or changed host key (exit 3, with how to trust it; a changed key is never replaced)."""
from __future__ import annotations

import os
import time

import pytest

from k3deploy.errors import ExecError
from k3deploy.executors import SshTarget, open_executor
from k3deploy.records.store import StateStore
from tests import figures
from tests.integration.sim_deployments import Deployments, hosts_empty
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig

pytestmark = pytest.mark.integration


@pytest.mark.timeout(90)
def test_unreachable_host_fails_within_the_connect_deadline(deployments: Deployments, rig4: HostRig) -> None:
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    dead_ip = f"10.232.{rig4.subnet}.99"  # on the rig network, nobody there
    nodes[3]["host"] = dead_ip
    figures.fault_injected()
    topo = deployments.topology("it-unreachable", nodes=nodes, launch={"dist_timeout_s": 300})
    t0 = time.monotonic()
    run = cli("launch", str(topo))
    took = time.monotonic() - t0
    assert run.returncode == 3, run.stderr
    assert f"error: {dead_ip}: cannot connect to root@{dead_ip}:22 after 3 attempts" in run.stderr
    assert took < 90, took  # 3 x 2 s connect timeout + backoff, not the 300 s dist timeout
    assert hosts_empty(rig4)  # nothing was started anywhere
    rec = StateStore(deployments.state_dir).require("it-unreachable")
    assert rec.status == "failed" and rec.failure is not None and rec.failure.host == dead_ip


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mistake", ["iface", "ip"])
def test_wrong_interface_or_ip_on_one_node_fails_before_anything_starts(deployments: Deployments, rig4: HostRig,
                                                                        mistake: str) -> None:
    """A wrong `iface` (Gloo would fail) or a wrong `ip` (a typo: the group would hang until the distributed
    timeout) is found on the node itself before rank 0 starts, naming the node and what it has."""
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    if mistake == "iface":
        nodes[3]["iface"] = "ens-bogus"
        says = "has no interface ens-bogus (it has: ens-mgmt, ens-priv, lo); fix nodes[].iface"
    else:
        nodes[3]["ip"] = typo = f"10.231.{rig4.subnet}.99"  # on the right network, but nobody's address
        says = (f"{typo} is not an address of ens-priv on this node (ens-priv has: "
                f"{rig4.hosts[3].priv_ip}); fix nodes[].ip or nodes[].iface")
    topo = deployments.topology(f"it-wrong-{mistake}", nodes=nodes, launch={"dist_timeout_s": 300})
    figures.fault_injected()
    t0 = time.monotonic()
    run = cli("launch", str(topo))
    took = time.monotonic() - t0
    assert run.returncode == 4, run.stderr
    assert f"rank 3 ({rig4.hosts[3].mgmt_ip}): {says}" in run.stderr, run.stderr
    assert hosts_empty(rig4)
    assert not (deployments.tmp / "logs" / f"it-wrong-{mistake}-rank0.log").exists()  # nothing was started
    assert took < 90, took  # seconds, not launch.dist_timeout_s (300 s here)


@pytest.mark.timeout(90)
def test_unknown_host_key_is_refused_with_how_to_trust_it(deployments: Deployments, rig4: HostRig) -> None:
    empty = deployments.tmp / "known_hosts"
    empty.write_text("")
    figures.fault_injected()
    topo = deployments.topology("it-hostkey")
    run = cli("launch", str(topo), "--known-hosts", str(empty))
    assert run.returncode == 3, run.stderr
    assert "unknown host key" in run.stderr and "ssh-keyscan -H" in run.stderr
    assert "--accept-new-host-keys" in run.stderr
    assert hosts_empty(rig4)

    host = rig4.hosts[0]
    target = SshTarget(host=host.mgmt_ip, user="root", key=str(rig4.key_path),
                        known_hosts=str(empty), ssh_config=None)
    trusting = open_executor(target.model_copy(update={"accept_new_host_keys": True}))
    trusting.connect()
    trusting.close()
    assert host.mgmt_ip in empty.read_text()
    strict = open_executor(target)
    strict.connect()  # now known
    strict.close()
    other_key = rig4.known_hosts_path.read_text().splitlines()[1].split()[1:3]  # h02's key
    empty.write_text(f"{host.mgmt_ip} {' '.join(other_key)}\n")
    figures.fault_injected()
    changed = open_executor(target.model_copy(update={"accept_new_host_keys": True}))
    with pytest.raises(ExecError, match="HOST KEY CHANGED") as err:
        changed.connect()
    assert err.value.host == host.mgmt_ip and "ssh-keygen -R" in (err.value.hint or "")
    assert os.path.getsize(empty) < 200  # nothing was added
    # The same through the command line: the flag trusts new keys only; a changed one stops the launch.
    changed_run = cli("launch", str(topo), "--known-hosts", str(empty), "--accept-new-host-keys")
    assert changed_run.returncode == 3, changed_run.stderr
    assert "HOST KEY CHANGED" in changed_run.stderr and host.mgmt_ip in changed_run.stderr
    assert "Traceback" not in changed_run.stderr
    lines = [ln for ln in empty.read_text().splitlines() if ln.split()[0] == host.mgmt_ip]
    assert lines == [f"{host.mgmt_ip} {' '.join(other_key)}"]  # the changed key was not replaced
    assert hosts_empty(rig4)
