"""Tests of the multi-host rig itself: hosts, SSH, host keys, processes, teardown (its networks:
test_rig_network.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest

from k3deploy.launch.ipc import ipc_dir
from tests.polling import wait_for
from tests.rig import HostRig, RigHost, cleanup_stale, pid_alive, procs
from tests.rig.netns import owned_links, owned_netns
from tests.rig.registry import registry_path

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DETACHED_SLEEP = "cd /tmp; setsid nohup sleep 300 > /tmp/{log}.log 2>&1 < /dev/null & echo $!"


def ssh_run(client: paramiko.SSHClient, command: str, timeout_s: float = 10.0) -> str:
    """Run a command over SSH and return its stdout (asserting exit status 0)."""
    _, stdout, stderr = client.exec_command(command, timeout=timeout_s)
    out = stdout.read().decode()
    assert stdout.channel.recv_exit_status() == 0, stderr.read().decode()
    return out


def rig_processes(rig: HostRig) -> set[int]:
    """Root-namespace PIDs of everything the rig runs: launchers, sshds, and all in its namespaces."""
    found: set[int] = set()
    for host in rig.hosts:
        found |= set(procs.netns_pids(host.ns)) | set(rig.pids(host, root_ns=True))
        found.add(rig.sshd_pid(host))
    return found


def assert_gone(ident: str, pids: set[int], workdir: Path) -> None:
    assert owned_netns(ident) == []
    assert owned_links(ident) == []
    assert [p for p in pids if pid_alive(p)] == []
    assert not workdir.exists()
    assert not registry_path(ident).exists()


@pytest.mark.timeout(60)
def test_four_hosts_come_up(rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print("\n4 hosts: " + ", ".join(f"{k}={v:.3f}" for k, v in rig4.timings.items()))
    assert [h.name for h in rig4.hosts] == ["h01", "h02", "h03", "h04"]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    for i, host in enumerate(rig4.hosts, start=1):
        assert host.ns in netns
        assert host.priv_ip == f"10.231.{rig4.subnet}.{10 + i}"
        assert host.mgmt_ip == f"10.232.{rig4.subnet}.{10 + i}"
        assert rig4.exec(host, ["hostname"]).stdout.strip() == host.name
        addrs = json.loads(rig4.exec(host, ["ip", "-j", "-4", "addr"]).stdout)
        by_iface = {a["ifname"]: [x["local"] for x in a["addr_info"]] for a in addrs}
        assert by_iface == {"lo": ["127.0.0.1"], "ens-priv": [host.priv_ip], "ens-mgmt": [host.mgmt_ip]}
        assert "default" not in rig4.exec(host, ["ip", "route"]).stdout
        ps = rig4.exec(host, ["ps", "-eo", "pid=,comm="]).stdout.split("\n")
        assert ps[0].split() == ["1", "sshd"]  # own PID namespace, sshd is PID 1
    assert rig4.root_priv_ip == f"10.231.{rig4.subnet}.1"
    assert rig4.root_mgmt_ip == f"10.232.{rig4.subnet}.1"


@pytest.mark.timeout(60)
def test_paramiko_reaches_every_host_on_both_networks(rig4: HostRig) -> None:
    for host in rig4.hosts:
        for ip in (host.mgmt_ip, host.priv_ip):
            client = paramiko.SSHClient()
            client.load_host_keys(str(rig4.known_hosts_path))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(
                ip, username="root", key_filename=str(rig4.key_path), timeout=10,
                look_for_keys=False, allow_agent=False,
            )  # fmt: skip
            try:
                assert ssh_run(client, "hostname").strip() == host.name
            finally:
                client.close()


@pytest.mark.timeout(60)
def test_ssh_config_aliases_resolve(rig4: HostRig) -> None:
    config = paramiko.SSHConfig.from_path(str(rig4.ssh_config_path))
    entry = config.lookup("h03")
    assert entry["hostname"] == rig4.host("h03").mgmt_ip
    assert entry["user"] == "root"
    assert entry["identityfile"] == [str(rig4.key_path)]
    assert entry["userknownhostsfile"] == str(rig4.known_hosts_path)
    client = paramiko.SSHClient()
    client.load_host_keys(entry["userknownhostsfile"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        entry["hostname"], username=entry["user"], key_filename=entry["identityfile"], timeout=10,
        look_for_keys=False, allow_agent=False,
    )  # fmt: skip
    try:
        assert ssh_run(client, "hostname").strip() == "h03"
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_unknown_host_key_is_refused(rig4: HostRig, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    client = paramiko.SSHClient()
    client.load_host_keys(str(empty))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="known_hosts"):
        client.connect(
            rig4.hosts[0].mgmt_ip, username="root", key_filename=str(rig4.key_path), timeout=10,
            look_for_keys=False, allow_agent=False,
        )  # fmt: skip
    client.close()


@pytest.mark.timeout(60)
def test_detached_process_is_seen_and_gone_after_teardown(make_rig: Callable[..., HostRig]) -> None:
    rig = make_rig(2)
    host = rig.host("h02")
    client = rig.ssh_client(host)
    try:
        pid = int(ssh_run(client, DETACHED_SLEEP.format(log=rig.ident)).strip())
    finally:
        client.close()
    assert pid in rig.pids(host)
    assert pid not in rig.pids("h01")
    root_pid = next(p for p in rig.pids(host, root_ns=True) if procs.ns_local_pid(p) == pid)
    # `$!` is the forked shell: it becomes setsid, then nohup, then sleep, each an exec that a busy machine
    # may not have reached yet when the PID is printed.
    assert wait_for(lambda: str(procs.exe_path(root_pid)).endswith("sleep"), 60), procs.exe_path(root_pid)
    assert str(pid) in rig.exec(host, ["ps", "-eo", "pid="]).stdout.split()
    rig.close()
    assert not pid_alive(root_pid)
    Path(f"/tmp/{rig.ident}.log").unlink(missing_ok=True)


@pytest.mark.timeout(60)
def test_kill_host_processes_keeps_sshd_and_removes_their_ipc_dirs(rig4: HostRig) -> None:
    host = rig4.host("h04")
    client = rig4.ssh_client(host)
    # A k3deploy node's IPC directory on the hosts' shared /tmp: a kill without `stop` must not leave it.
    ipc = Path(ipc_dir(f"{rig4.ident}.0.kill"))
    try:
        ipc.mkdir()
        pid = int(ssh_run(client, f"export VLLM_RPC_BASE_PATH={ipc}; " + DETACHED_SLEEP.format(log=rig4.ident)).strip())
        assert pid in rig4.pids(host)
        rig4.kill_host_processes(host)
        assert pid not in rig4.pids(host)
        assert ssh_run(client, "hostname").strip() == "h04"  # the open session survived
        assert not ipc.exists()
    finally:
        client.close()
        Path(f"/tmp/{rig4.ident}.log").unlink(missing_ok=True)
        shutil.rmtree(ipc, ignore_errors=True)


@pytest.mark.timeout(60)
def test_two_rigs_do_not_collide(rig4: HostRig, make_rig: Callable[..., HostRig]) -> None:
    other = make_rig(1)
    assert other.ident != rig4.ident and other.subnet != rig4.subnet
    client = other.ssh_client("h01")
    try:
        assert ssh_run(client, "hostname").strip() == "h01"
    finally:
        client.close()
    assert rig4.exec("h01", ["hostname"]).stdout.strip() == "h01"


@pytest.mark.timeout(60)
def test_close_leaves_nothing_and_is_idempotent(make_rig: Callable[..., HostRig]) -> None:
    rig = make_rig(3)
    ident, workdir, pids = rig.ident, rig.workdir, rig_processes(rig)
    assert len(owned_netns(ident)) == 3 and registry_path(ident).exists()
    rig.close()
    assert_gone(ident, pids, workdir)
    rig.close()


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("root_only")
def test_cleanup_stale_removes_a_crashed_rig() -> None:
    crash = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); from tests.rig import HostRig; "
        "r = HostRig(2); print(r.ident, r.workdir, r.sshd_pid('h01'), r.sshd_pid('h02'), flush=True); "
        "os._exit(0)"  # no atexit, no close: what a killed pytest leaves behind
    )
    run = subprocess.run(
        [sys.executable, "-c", crash, str(REPO)], capture_output=True, text=True, timeout=30, check=False
    )
    assert run.returncode == 0, run.stderr
    ident, workdir, *sshd = run.stdout.split()
    assert len(owned_netns(ident)) == 2 and all(pid_alive(int(p)) for p in sshd)
    assert ident in cleanup_stale()
    assert_gone(ident, {int(p) for p in sshd}, Path(workdir))


@pytest.mark.timeout(120)
def test_thirty_two_hosts_up_and_down(
    make_rig: Callable[..., HostRig], capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()
    rig = make_rig(32)
    up_s = time.monotonic() - t0

    def hostname(host: RigHost) -> str:
        client = rig.ssh_client(host)
        try:
            return ssh_run(client, "hostname").strip()
        finally:
            client.close()

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        names = list(pool.map(hostname, rig.hosts))
    fanout_s = time.monotonic() - t0
    assert names == [f"h{i:02d}" for i in range(1, 33)]
    ident, workdir, pids = rig.ident, rig.workdir, rig_processes(rig)
    rig.close()
    assert_gone(ident, pids, workdir)
    with capsys.disabled():
        phases = ", ".join(f"{k}={v:.3f}" for k, v in rig.timings.items())
        print(f"\n32 hosts: up {up_s:.2f} s ({phases}); SSH fan-out {fanout_s:.2f} s")
