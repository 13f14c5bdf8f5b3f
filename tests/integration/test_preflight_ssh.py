"""`k3deploy preflight` over SSH on four network-namespace hosts: a clean rig passes; each classic
multi-node mistake is caught on the node that has it, named, with a fix, in seconds.

Per-host faults touch one host only: the rig hosts share this machine's filesystem but each sshd (and so
every SSH session) lives in its own mount namespace (unshare makes mounts private), so a bind mount made
there with `nsenter` (rig.exec) is seen by that host alone: a 127.0.1.1 /etc/hosts, a fake nvidia-smi in
/usr/local/sbin (first on root's PATH over SSH, empty here), another engine data file, an empty directory hiding the
checkpoint.
Routes and listeners live in the host's network namespace."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from k3deploy.engines.flag_tables import DATA_DIR, TABLE_FILES
from k3deploy.launch.bringup import fleet_of
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.preflight.rendezvous import collective_check
from tests.integration.sim_deployments import SimDeployments
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig

pytestmark = pytest.mark.integration
PORT = 29500


def preflight(topo: Path, capsys: pytest.CaptureFixture[str], what: str) -> tuple[int, dict[str, Any]]:
    """Run `k3deploy preflight --json`; print and return (exit code, report)."""
    t0 = time.monotonic()
    run = cli("preflight", str(topo), "--json", "--ssh-config", "/dev/null")
    took = time.monotonic() - t0
    assert run.stdout.strip(), run.stderr
    report = json.loads(run.stdout)
    with capsys.disabled():
        print(f"\npreflight, {what}: exit {run.returncode} in {took:.1f} s ({stages(report)})")
    return run.returncode, report


def stages(report: dict[str, Any]) -> str:
    """The report's own time and its two slow stages."""
    took = {c["name"]: c["elapsed_s"] for c in report["checks"]}
    return (f"report {report['elapsed_s']:.1f} s: port {took['port']:.1f} s, rendezvous {took['rendezvous']:.1f} s, "
            f"facts and the rest {report['elapsed_s'] - took['port'] - took['rendezvous']:.1f} s")


def failed(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    """The failed verdicts of one check."""
    c = next(c for c in report["checks"] if c["name"] == check)
    return [v for v in c["verdicts"] if v["status"] == "fail"]


def only_failure(report: dict[str, Any], check: str, rank: int, says: str) -> dict[str, Any]:
    """`check` failed on `rank` alone, saying `says`, with a fix; every other check passed or was skipped."""
    bad = failed(report, check)
    assert [v["rank"] for v in bad] == [rank], bad
    assert says in bad[0]["detail"] and bad[0]["fix"], bad[0]
    others = {c["name"]: c["status"] for c in report["checks"] if c["name"] not in (check, "rendezvous")}
    assert set(others.values()) <= {"pass", "skip"}, others
    return bad[0]


@contextmanager
def mounted(rig: HostRig, host: str, source: Path, target: str, *extra: str) -> Iterator[None]:
    """A bind mount (or `extra` mount options) seen by one host only; undone afterwards."""
    argv = ["mount", *(extra or ("--bind",)), str(source), target]
    r = rig.exec(host, argv)
    assert r.returncode == 0, r.stderr
    try:
        yield
    finally:
        rig.exec(host, ["umount", target])


@pytest.mark.timeout(120)
def test_a_clean_rig_passes_with_bandwidth_per_node(deployments: SimDeployments, rig4: HostRig, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    topo = deployments.topology("pf-clean")
    junit = tmp_path / "preflight.xml"
    code, report = preflight(topo, capsys, "clean 4-host rig")
    assert code == 0, json.dumps(report, indent=1)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["rendezvous"] == "pass" and statuses["port"] == "pass" and statuses["iface"] == "pass"
    assert statuses["accelerators"] == "skip"  # hardware sim: stated, not silently passed
    assert sorted(report["measurements"]) == ["0", "1", "2", "3"]
    gloo = report["measurements"]["1"]["gloo"]
    assert gloo["wrong_elements"] == 0 and gloo["busbw_gbps"] == pytest.approx(gloo["algbw_gbps"] * 1.5, rel=1e-3)
    with capsys.disabled():
        for rank, m in sorted(report["measurements"].items()):
            print(f"  rank {rank}: gloo all_reduce {m['gloo']['bytes'] >> 20} MiB {m['gloo']['seconds'] * 1e3:.0f} ms, "
                  f"busbw {m['gloo']['busbw_gbps']:.3f} GB/s, probe {m['elapsed_s']:.1f} s")
    human = cli("preflight", str(topo), "--junit", str(junit), "--ssh-config", "/dev/null")
    assert human.returncode == 0 and "preflight passed" in human.stdout, human.stdout + human.stderr
    xml = junit.read_text()
    assert 'name="preflight.rendezvous"' in xml and "<failure" not in xml


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mistake", ["iface", "ip"])
def test_wrong_interface_or_ip(deployments: SimDeployments, rig4: HostRig, mistake: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    if mistake == "iface":
        nodes[3]["iface"] = "ens-bogus"
        says = "has no interface ens-bogus (it has: ens-mgmt, ens-priv, lo)"
    else:
        nodes[3]["ip"] = f"10.231.{rig4.subnet}.99"
        says = f"is not an address of ens-priv on this node (ens-priv has: {rig4.hosts[3].priv_ip})"
    code, report = preflight(deployments.topology(f"pf-{mistake}", nodes=nodes), capsys, f"wrong {mistake}")
    assert code == 1
    v = failed(report, "iface")
    assert [x["rank"] for x in v] == [3] and says in v[0]["detail"] and "nodes[]." in v[0]["fix"]
    rdv = next(c for c in report["checks"] if c["name"] == "rendezvous")
    assert rdv["status"] == "skip" and "iface" in rdv["verdicts"][0]["detail"]


@pytest.mark.timeout(90)
def test_hostname_mapped_to_loopback(deployments: SimDeployments, rig4: HostRig, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.1.1 h03\n")
    with mounted(rig4, "h03", hosts, "/etc/hosts"):
        code, report = preflight(deployments.topology("pf-hostname"), capsys, "hostname -> 127.0.1.1 on h03")
    assert code == 1
    v = only_failure(report, "hostname", 2, "hostname h03 resolves to 127.0.1.1 (loopback)")
    assert rig4.hosts[2].priv_ip in v["fix"] and "/etc/hosts" in v["fix"]


@pytest.mark.timeout(90)
def test_head_port_taken_by_another_process(deployments: SimDeployments, rig4: HostRig,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    head = rig4.hosts[0]
    # SO_REUSEADDR: an earlier test's rendezvous may have left connections in TIME_WAIT on the port.
    code = (f"import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(({head.priv_ip!r}, {PORT})); s.listen(); "
            "print('up', flush=True); time.sleep(120)")
    squatter = subprocess.Popen(["nsenter", "--target", str(rig4.sshd_pid(head)), "--pid", "--mount", "--net", "--",
                                 sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "up"
        code_, report = preflight(deployments.topology("pf-port-taken"), capsys, "head port taken")
    finally:
        os.killpg(squatter.pid, signal.SIGKILL)
        squatter.wait(10)
    assert code_ == 1
    v = only_failure(report, "port", 0, f"cannot listen on {head.priv_ip}:{PORT}: Address already in use")
    assert "held by pid" in v["detail"] and "socket.socket()" in v["detail"] and "launch.port" in v["fix"]


@pytest.mark.timeout(90)
def test_head_port_unreachable_from_one_worker(deployments: SimDeployments, rig4: HostRig,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    head, victim = rig4.hosts[0], rig4.hosts[3]
    route = ["ip", "-n", victim.ns, "route", "add", "unreachable", f"{head.priv_ip}/32"]
    subprocess.run(route, check=True, timeout=10)
    try:
        code, report = preflight(deployments.topology("pf-port-blocked"), capsys, "head port unreachable from h04")
    finally:
        subprocess.run([*route[:4], "del", *route[5:]], check=True, timeout=10)
    assert code == 1
    v = only_failure(report, "port", 3, f"cannot connect to the head's {head.priv_ip}:{PORT}: No route to host")
    assert f"open TCP port {PORT}" in v["fix"]


FAKE_NVIDIA_SMI = """#!/bin/sh
# nvidia-smi's real output for these queries (csv,noheader,nounits), one H100, driver DRIVER
case "$1" in
  --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 81559, 1, DRIVER" ;;
  --query-compute-apps=*) ;;
  *) echo "| NVIDIA-SMI DRIVER    Driver Version: DRIVER    CUDA Version: 12.4     |" ;;
esac
"""


@pytest.mark.timeout(120)
def test_a_different_driver_version_on_one_node(deployments: SimDeployments, rig4: HostRig, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    topo = deployments.topology("pf-driver")
    topo.write_text(topo.read_text().replace("gpu: sim", "gpu: h100-80gb"))
    with ExitStack() as stack:
        for h in rig4.hosts:
            folder = tmp_path / h.name
            folder.mkdir()
            tool = folder / "nvidia-smi"
            tool.write_text(FAKE_NVIDIA_SMI.replace("DRIVER", "550.90.07" if h.name == "h02" else "550.54.15"))
            tool.chmod(0o755)
            stack.enter_context(mounted(rig4, h.name, folder, "/usr/local/sbin"))
        code, report = preflight(topo, capsys, "driver 550.90.07 on h02, 550.54.15 elsewhere")
    assert code == 1
    assert not failed(report, "accelerators"), failed(report, "accelerators")
    only_failure(report, "driver", 1, "driver 550.90.07 / toolkit 12.4; the other nodes have 550.54.15 / toolkit 12.4")


@pytest.mark.timeout(90)
def test_an_engine_version_mismatch_on_one_node(deployments: SimDeployments, rig4: HostRig, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    table = DATA_DIR / TABLE_FILES["sglang"]
    other = tmp_path / table.name
    data = json.loads(table.read_text())
    data["engine"] = "sglang 0.5.22"
    other.write_text(json.dumps(data))
    with mounted(rig4, "h02", other, str(table)):  # h02's engine installation is another release
        code, report = preflight(deployments.topology("pf-engine"), capsys, "sglang 0.5.22 on h02")
    assert code == 1
    v = only_failure(report, "engine", 1, "engine version 0.5.22; expected 0.5.23")
    assert "0.5.23" in v["fix"]


@pytest.mark.timeout(90)
def test_a_missing_checkpoint_on_one_node(deployments: SimDeployments, rig4: HostRig, checkpoint: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with mounted(rig4, "h04", Path("none"), str(checkpoint.parent), "-t", "tmpfs"):  # an empty disk there
        code, report = preflight(deployments.topology("pf-ckpt"), capsys, "no checkpoint on h04")
    assert code == 1
    v = only_failure(report, "checkpoint", 3, f"no checkpoint at {checkpoint}")
    assert "GiB free there" in v["detail"] and "download the checkpoint" in v["fix"]


@pytest.mark.timeout(120)
def test_the_gloo_probe_names_the_node_with_a_wrong_interface_variable(
        deployments: SimDeployments, rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    """No topology can give one node another interface variable (the iface check would catch it), so this
    drives the probe with one rank's environment overridden. (`lo` on one rank is no failure on this rig:
    the all_reduce completes, Gloo's connections from that rank go out by route.)"""
    ifname = "ens-bogus"
    cat = catalog_for(None)
    plan = require_feasible(deployments.topology(f"pf-gloo-{ifname}"), cat)
    jobs = jobs_for(plan, None, cat)
    nodes = {j.rank: j for j in jobs}
    t0 = time.monotonic()
    with fleet_of(jobs) as fleet:
        verdicts, measured = collective_check(fleet, nodes, PORT, nbytes=1 << 20, timeout_s=10.0,
                                              env_override={2: {"GLOO_SOCKET_IFNAME": ifname}})
    took = time.monotonic() - t0
    with capsys.disabled():
        print(f"\ngloo probe with GLOO_SOCKET_IFNAME={ifname} on rank 2: failed in {took:.1f} s")
        for v in verdicts:
            print(f"  rank {v.rank}: {v.status}: {v.detail}")
    assert measured == {} and all(v.status == "fail" for v in verdicts), verdicts
    assert f"GLOO_SOCKET_IFNAME={ifname} on a node whose private interface is ens-priv" in verdicts[2].detail
    assert all(f"rank 2 ({rig4.hosts[2].mgmt_ip})" in v.fix for v in verdicts if v.rank != 2), verdicts
    assert took < 10.0 + 60.0  # the watchdog, not Gloo's own retry loop, bounds it
