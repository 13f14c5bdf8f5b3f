"""`k3deploy preflight` of a service over SSH on the namespace rig: 2 replicas x 2 hosts of the stand-in behind
smg, the router on the first rig host (its port checked there, its interpreter the routers venv's). A clean
rig passes every instance's checks, rendezvous included, at once; a wrong interface on one node of replica 1
fails naming replica 1 and that node, replica 0's checks all shown and passing."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.sim_deployments import SimDeployments
from tests.integration.test_router_tables import VENV, needs_routers
from tests.k3deploy_cli import run_k3deploy as cli
from tests.ports import closed_port
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, needs_routers]


def _service(d: SimDeployments, rig: HostRig, name: str, nodes: list[dict[str, Any]] | None = None) -> Path:
    topo = d.topology(name, nodes=nodes)
    doc: dict[str, Any] = yaml.safe_load(topo.read_text())
    doc["parallel"] = {"tp": 2, "ep": 2}
    doc["replicas"] = 2
    doc["router"] = {"kind": "smg", "runs_on": rig.hosts[0].mgmt_ip, "port": closed_port(),
                     "metrics_port": closed_port(), "python": str(VENV / "bin/python")}
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    return topo


def _preflight(topo: Path, capsys: pytest.CaptureFixture[str], what: str) -> tuple[int, dict[str, Any]]:
    t0 = time.monotonic()
    run = cli("preflight", str(topo), "--json", "--ssh-config", "/dev/null", timeout_s=240)
    took = time.monotonic() - t0
    assert run.stdout.strip(), run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    with capsys.disabled():
        inst = ", ".join(f"{i['instance']} {i['elapsed_s']:.1f} s" for i in report["instances"])
        print(f"\nservice preflight, {what}: exit {run.returncode} in {took:.1f} s (report {report['elapsed_s']:.1f} s: "
              f"{inst})")
    return run.returncode, report


def _statuses(part: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in part["checks"]}


@pytest.mark.timeout(300)
def test_two_replicas_pass_every_check_at_once(deployments: SimDeployments, rig4: HostRig, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    topo = _service(deployments, rig4, "pfs-clean")
    code, report = _preflight(topo, capsys, "clean rig, 2 replicas x 2 hosts")
    assert code == 0, json.dumps(report, indent=1)
    assert [(i["name"], i["instance"]) for i in report["instances"]] == [("pfs-clean-r0", "replica 0"),
                                                                        ("pfs-clean-r1", "replica 1")]
    for i, part in enumerate(report["instances"]):
        st = _statuses(part)
        assert st["rendezvous"] == "pass" and st["port"] == "pass" and st["iface"] == "pass", st
        hosts = {v["host"] for c in part["checks"] for v in c["verdicts"]}
        assert hosts == {rig4.hosts[2 * i].mgmt_ip, rig4.hosts[2 * i + 1].mgmt_ip}, hosts  # its own nodes only
        assert sorted(part["measurements"]) == ["0", "1"]
    assert _statuses(report) == {"router-port": "pass", "router-python": "pass"}
    assert report["checks"][0]["verdicts"][0]["host"] == rig4.hosts[0].mgmt_ip
    junit = tmp_path / "p.xml"
    human = cli("preflight", str(topo), "--junit", str(junit), "--ssh-config", "/dev/null", timeout_s=240)
    assert human.returncode == 0 and "preflight passed" in human.stdout, human.stdout + human.stderr
    assert "preflight pfs-clean-r0 (replica 0)" in human.stdout and "preflight pfs-clean-r1 (replica 1)" in human.stdout
    xml = junit.read_text()
    assert xml.count("<testsuite ") == 3 and 'name="preflight.pfs-clean-r1"' in xml and "<failure" not in xml


@pytest.mark.timeout(300)
def test_a_wrong_interface_on_one_replica_names_it_and_shows_the_other(
        deployments: SimDeployments, rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    nodes[3]["iface"] = "ens-bogus"  # replica 1's rank 1
    topo = _service(deployments, rig4, "pfs-iface", nodes)
    code, report = _preflight(topo, capsys, "ens-bogus on replica 1's second node")
    assert code == 1
    failed = [(p["instance"], c["name"], v["rank"], v["host"]) for p in (*report["instances"], report)
              for c in p["checks"] for v in c["verdicts"] if v["status"] == "fail"]
    assert failed == [("replica 1", "iface", 1, rig4.hosts[3].mgmt_ip)], failed
    r0, r1 = report["instances"]
    assert set(_statuses(r0).values()) <= {"pass", "skip"} and _statuses(r0)["rendezvous"] == "pass", _statuses(r0)
    assert all(len(c["verdicts"]) == 2 for c in r0["checks"])  # the other replica's checks are all there
    assert _statuses(r1)["rendezvous"] == "skip" and r0["exit_code"] == 0 and r1["exit_code"] == 1
    human = cli("preflight", str(topo), "--ssh-config", "/dev/null", timeout_s=240)
    assert human.returncode == 1, human.stderr
    assert f"replica 1: iface: rank 1 ({rig4.hosts[3].mgmt_ip}): " in human.stdout and "ens-bogus" in human.stdout
    noted = [line for line in human.stdout.splitlines() if line.startswith("replica 0: ")]
    assert not [line for line in noted if re.match(r"replica 0: [\w-]+: rank ", line)], noted  # no failure there
    assert any(line.startswith("replica 0: rendezvous rank 1 ") and "all_reduce" in line for line in noted), noted


@pytest.mark.timeout(300)
def test_an_unreachable_node_in_one_replica_and_a_failure_in_the_other_exit_3(
        deployments: SimDeployments, rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    """The exit code is the worst over the instances, with preflight's order: a node it could not ask (3) before
    a failed check (1); each instance's own exit code says which it was."""
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    dead_ip = f"10.232.{rig4.subnet}.99"  # on the rig network, nobody there
    nodes[1]["iface"] = "ens-bogus"  # replica 0's rank 1
    nodes[3]["host"] = dead_ip  # replica 1's rank 1
    code, report = _preflight(_service(deployments, rig4, "pfs-mixed", nodes), capsys, "ens-bogus on replica 0, "
                              "replica 1's second node unreachable")
    assert code == 3, json.dumps(report, indent=1)
    r0, r1 = report["instances"]
    assert (r0["exit_code"], r1["exit_code"]) == (1, 3)
    rows = {(p["instance"], c["name"], v["rank"]): v for p in (r0, r1) for c in p["checks"] for v in c["verdicts"]}
    assert rows[("replica 0", "iface", 1)]["status"] == "fail" and "ens-bogus" in rows[("replica 0", "iface", 1)]["detail"]
    down = rows[("replica 1", "reachability", 1)]
    assert down["status"] == "error" and down["host"] == dead_ip and f"cannot connect to root@{dead_ip}:22" in \
        down["detail"], down
    assert rows[("replica 1", "reachability", 0)]["status"] == "pass"
    assert _statuses(report) == {"router-port": "pass", "router-python": "pass"}
