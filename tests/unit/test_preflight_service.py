"""`k3deploy preflight` of a service (replicas behind a router; prefill/decode roles): every instance's checks,
each named (table, JSON, one JUnit suite per instance), the router's machine, and the worst exit code."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.preflight.report import CheckResult, Report, Verdict
from k3deploy.preflight.views import write_junit
from tests.k3deploy_cli import run_k3deploy
from tests.ports import closed_port

ROOT = Path(__file__).resolve().parents[2]
REPLICAS = ROOT / "tests" / "assets" / "replicas" / "local-2x2-smg.yaml"
PD = ROOT / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"


def _check(name: str, *statuses: str) -> CheckResult:
    rows = tuple(Verdict(rank=r, host=f"h{r}", status=s, detail=f"{name} {s}", fix="do it" if s == "fail" else "")  # type: ignore[arg-type]
                 for r, s in enumerate(statuses))
    return CheckResult(name=name, title=name, asks="?", verdicts=rows)


def _service(r0: tuple[str, ...], r1: tuple[str, ...], router: str = "pass") -> Report:
    parts = tuple(Report(name=f"svc-r{i}", instance=f"replica {i}", checks=(_check("iface", *s),), elapsed_s=1.0)
                  for i, s in enumerate((r0, r1)))
    return Report(name="svc", checks=(_check("router-port", router),), instances=parts, elapsed_s=1.0)


@pytest.mark.timeout(30)
def test_a_service_report_is_the_worst_of_its_instances_and_names_each() -> None:
    assert _service(("pass", "pass"), ("pass", "skip")).exit_code == 0
    failed = _service(("pass", "pass"), ("pass", "fail"))
    assert failed.exit_code == 1
    assert failed.summary() == "replica 1: iface: rank 1 (h1): iface fail; do it"
    check, row = failed.first_failure() or (None, None)
    assert check is not None and row is not None and (check.name, row.rank) == ("iface", 1)
    # An unreachable node in one instance beats a failure in another (it may hide any failure): 3.
    assert _service(("fail", "pass"), ("error", "pass")).exit_code == 3
    assert _service(("pass", "pass"), ("pass", "pass"), router="fail").exit_code == 1
    assert _service(("pass", "pass"), ("pass", "pass"), router="error").exit_code == 3
    doc = failed.as_json()
    assert doc["exit_code"] == 1 and [c["name"] for c in doc["checks"]] == ["router-port"]
    assert [(i["name"], i["instance"], i["exit_code"]) for i in doc["instances"]] == \
        [("svc-r0", "replica 0", 0), ("svc-r1", "replica 1", 1)]
    assert doc["instances"][1]["checks"][0]["status"] == "fail"
    single = Report(name="one", checks=(_check("iface", "pass"),), elapsed_s=1.0).as_json()
    assert single["instances"] == [] and single["instance"] == "" and single["exit_code"] == 0


@pytest.mark.timeout(30)
def test_a_service_junit_has_a_suite_per_instance(tmp_path: Path) -> None:
    from junitparser import JUnitXml

    write_junit(_service(("pass", "pass"), ("pass", "fail")), tmp_path / "s.xml")
    xml = JUnitXml.fromfile(str(tmp_path / "s.xml"))
    suites = {s.name: [c for c in s] for s in xml}
    assert list(suites) == ["preflight.svc-r0", "preflight.svc-r1", "preflight.svc"]
    bad = [c for c in suites["preflight.svc-r1"] if not c.is_passed]
    assert [(c.name, c.classname) for c in bad] == [("replica 1: iface: rank 1 (h1)", "preflight.svc-r1.iface")]
    assert bad[0].result[0].text == "iface fail\nfix: do it"
    assert [c.name for c in suites["preflight.svc"]] == ["router-port: rank 0 (h0)"]
    write_junit(Report(name="one", checks=(_check("iface", "pass"),), elapsed_s=1.0), tmp_path / "o.xml")
    assert [s.name for s in JUnitXml.fromfile(str(tmp_path / "o.xml"))] == ["preflight.iface"]  # as before


def _topology(src: Path, tmp: Path, router_port: int) -> Path:
    """The asset on this host with ports nobody else uses and a checkpoint path that holds nothing."""
    doc: dict[str, Any] = yaml.safe_load(src.read_text())
    doc["model"]["path"] = str(tmp / "no-checkpoint")
    doc["engine"]["port"] = closed_port()
    doc["launch"]["port"] = closed_port()
    doc["router"].update(port=router_port, metrics_port=closed_port())
    path = tmp / src.name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _failed(report: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(instance, check, rank) of every failed row."""
    return [(p["instance"], c["name"], v["rank"]) for p in (*report["instances"], report) for c in p["checks"]
            for v in c["verdicts"] if v["status"] == "fail"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("src", "labels"), [(REPLICAS, ["replica 0", "replica 1"]), (PD, ["prefill 0", "decode 0"])])
def test_preflight_of_a_service_runs_every_instance_and_the_router_machine(src: Path, labels: list[str],
                                                                            tmp_path: Path) -> None:
    """Before: exit 2, "preflight of replicas or a router is not built yet". Each instance's nodes are checked
    (no checkpoint on any: each instance's checkpoint check fails on both its nodes), the router's port is
    held by another process here (named), the router's interpreter lacks the router."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        topo = _topology(src, tmp_path, port)
        run = run_k3deploy("preflight", topo, "--json", "--junit", tmp_path / "p.xml", timeout_s=150)
        human = run_k3deploy("preflight", topo, timeout_s=150)
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert [i["instance"] for i in report["instances"]] == labels
    fails = _failed(report)
    assert [f for f in fails if f[1] == "checkpoint"] == [(label, "checkpoint", r) for label in labels for r in (0, 1)]
    router = {c["name"]: c["verdicts"][0] for c in report["checks"]}
    assert router["router-port"]["status"] == "fail" and f"127.0.0.1:{port}: Address already in use" in \
        router["router-port"]["detail"] and "held by pid" in router["router-port"]["detail"], router
    assert router["router-python"]["status"] in ("pass", "fail"), router  # whichever python3 is here: it answered
    for i in report["instances"]:  # every instance ran every check on each of its two nodes
        assert len(i["checks"]) >= 10 and all(len(c["verdicts"]) == 2 for c in i["checks"]), i
    assert human.returncode == 1 and "Traceback" not in human.stderr, human.stderr
    for label in labels:
        assert f"({label})" in human.stdout and f"{label}: checkpoint: rank 1 (localhost): no checkpoint" in \
            human.stdout, human.stdout
    assert "router-port: rank 0 (localhost): cannot listen on" in human.stdout
    xml = (tmp_path / "p.xml").read_text()
    assert xml.count("<testsuite ") == len(labels) + 1, xml


def _held_port() -> socket.socket:
    """A loopback socket listening (the router's port taken by another process's socket: this one's)."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    return squatter


@pytest.mark.timeout(180)
@pytest.mark.parametrize("src", [REPLICAS, PD])
def test_launch_of_a_service_checks_the_router_machine_before_starting_any_instance(src: Path, tmp_path: Path) -> None:
    """Before: every instance was launched (its record written, its preflight run, its nodes started when it
    passed) and the taken router port was found only once they were ready. Now: exit 4 with the check's own
    line and fix naming the router's host, no instance's record or process, the service recorded failed."""
    from k3deploy.records.service import ServiceStore
    from k3deploy.records.store import StateStore

    with _held_port() as squatter:
        port = squatter.getsockname()[1]
        topo = _topology(src, tmp_path, port)
        run = run_k3deploy("launch", topo, "--state-dir", tmp_path / "state", timeout_s=150)
        as_json = run_k3deploy("launch", topo, "--state-dir", tmp_path / "json", "--json", timeout_s=150)
    assert run.returncode == 4, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    assert f"router-port: rank 0 (localhost): cannot listen on 127.0.0.1:{port}: Address already in use, held by " \
        "pid" in run.stderr, run.stderr
    assert "set router.port / router.metrics_port to free ports" in run.stderr
    assert "nothing was started" in run.stderr and "k3deploy launch --skip-preflight" in run.stderr
    store = StateStore(tmp_path / "state")
    svc = ServiceStore(store).load(yaml.safe_load(topo.read_text())["name"])
    assert svc is not None and (svc.status, svc.preflight) == ("failed", "failed"), svc
    assert "router-port: rank 0 (localhost)" in svc.cause
    assert as_json.returncode == 4 and json.loads(as_json.stdout)["preflight"] == "failed", as_json
    shown = run_k3deploy("status", svc.name, "--state-dir", tmp_path / "state")
    assert shown.returncode == 4 and "failed: preflight failed, nothing was started" in shown.stdout, shown
    names = [r.name for r in svc.replicas]
    assert len(names) == 2 and not [n for n in (*names, f"{svc.name}-router") if store.path(n).exists()], \
        sorted(p.name for p in store.directory.iterdir())


@pytest.mark.timeout(120)
def test_launch_of_a_service_whose_router_machine_cannot_be_reached_exits_3_starting_nothing(tmp_path: Path) -> None:
    """The router's machine does not answer (every connection fails: the router's is the only one launch
    opens before any instance starts): exit 3 as for any node launch cannot reach, named, nothing started."""
    from k3deploy.errors import ExecError
    from k3deploy.executors.local import LocalExecutor
    from k3deploy.executors.target import ExecTarget
    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.service import launch_service
    from k3deploy.nodeplan.targets import ExecOverrides
    from k3deploy.records.service import ServiceStore
    from k3deploy.records.store import StateStore

    asked: list[str] = []

    class Down(LocalExecutor):
        def connect(self) -> None:
            asked.append(self.host)
            raise ExecError("cannot connect after 3 attempts: timed out", host=self.host)

    def factory(target: ExecTarget) -> LocalExecutor:
        return Down(target.host)

    unit = prepare(_topology(REPLICAS, tmp_path, closed_port()), None, ExecOverrides())
    assert unit.router is not None
    store = StateStore(tmp_path / "state")
    with pytest.raises(ExecError) as err:
        launch_service(unit, store, factory=factory)
    assert err.value.exit_code == 3 and asked == ["localhost"]
    assert "router-port: rank 0 (localhost): not checked: cannot connect after 3 attempts" in str(err.value)
    assert "router.runs_on" in (err.value.hint or "")
    svc = ServiceStore(store).load(unit.name)
    assert svc is not None and (svc.status, svc.preflight) == ("failed", "failed"), svc
    assert not [p.name for p in store.directory.iterdir() if p.suffix == ".json"]


class _Recorder:
    """An executor that only records what it is asked (the router checks under Slurm must ask nothing)."""

    def __init__(self, target: Any) -> None:
        self.target, self.calls = target, []

    def __getattr__(self, name: str) -> Any:
        return lambda *_a, **_k: self.calls.append(name)


@pytest.mark.timeout(60)
def test_under_slurm_the_router_checks_skip_saying_why_and_ask_nothing() -> None:
    """A service launched through Slurm with the router on one of its nodes: that node is the job's, placed
    only once launch holds the allocation, so preflight cannot check it. Both router rows skip on the node
    `router.runs_on` names, saying so; nothing is run there; the report still passes. A router on this machine
    (`runs_on: local`) is checked here as with any executor."""
    from k3deploy.nodeplan.router_job import router_deployment
    from k3deploy.planning.plan import Plan
    from k3deploy.preflight.router_check import router_checks
    from tests.unit.test_render_support import doc_of, plan_of

    made: list[_Recorder] = []

    def factory(target: Any) -> Any:
        made.append(_Recorder(target))
        return made[-1]

    def checks_of(plan: Plan) -> Any:  # the router's job as the unit works it out
        assert plan.router is not None
        return router_checks(plan.router.settings, router_deployment(plan)[1], factory)

    checks = checks_of(plan_of(doc_of("replicas-h200-2x2x8-smg", **{"launch.executor": "slurm",
                                                                     "router.runs_on": "node-2"})))
    assert [c.name for c in checks] == ["router-port", "router-python"]
    for c in checks:
        (v,) = c.verdicts
        assert (v.status, v.rank, v.host) == ("skip", 0, "node-2"), v
        assert v.detail == "the router's node is the Slurm job's, known once launch holds it", v
    assert [(m.target.kind, m.calls) for m in made] == [("slurm", ["close"])]  # made, closed, never asked
    assert checks[0].asks == "bind 10.0.0.12:30000, 10.0.0.12:30001 (the router's port, its metrics)"
    report = Report(name="svc", checks=checks, elapsed_s=0.0)
    assert report.exit_code == 0 and report.first_failure() is None

    made.clear()
    here = checks_of(plan_of(doc_of("replicas-h200-2x2x8-smg", **{"launch.executor": "slurm",
                                                                   "router.runs_on": "local"})))
    assert [m.target.kind for m in made] == ["local"] and "connect" in made[0].calls, [m.calls for m in made]
    assert all(v.status != "skip" for c in here for v in c.verdicts), here
