"""Launch of prefill/decode roles: each instance a deployment of its own (its role's flags, nodes, ports and
records), the router in PD mode fronting the ready instances, a role with none ready refused, and the CLI's
dry run, preflight and rollout of a PD file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.target import ExecTarget
from k3deploy.launch.prepare import Unit, unit_of
from k3deploy.launch.service import launch_service
from k3deploy.nodeplan.router_job import fronting_only
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.files import require_feasible
from k3deploy.records.store import StateStore
from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"


def _unit(tmp_path: Path, decodes: int = 1) -> Unit:
    text = LOCAL.read_text(encoding="utf-8")
    if decodes == 2:  # 1P2D: the TP2 prefill, two one-node decodes
        text = text.replace("decode: {instances: 1, nodes: [127.0.0.3, 127.0.0.4], parallel: {tp: 2, ep: 2}}",
                            "decode: {instances: 2, nodes: [127.0.0.3, 127.0.0.4], parallel: {tp: 1}}")
    path = tmp_path / "pd.yaml"
    path.write_text(text, encoding="utf-8")
    cat = load_catalog()
    return unit_of(require_feasible(path, cat), ExecOverrides(), cat)


def test_each_instance_is_a_deployment_with_its_role_flags_ports_and_health_readiness(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    assert unit.roles == ("prefill", "decode")
    (pre, pre_jobs), (dec, dec_jobs) = ((p.plan, p.jobs) for p in unit.instances)
    assert (pre.topology.name, dec.topology.name) == ("k3-pd-prefill0", "k3-pd-decode0")
    assert (pre.topology.roles, pre.pd, pre.file) == (None, None, unit.plan.file)
    assert [j.ip for j in pre_jobs] == ["127.0.0.1", "127.0.0.2"] and [j.ip for j in dec_jobs] == [
        "127.0.0.3", "127.0.0.4"]
    head = pre_jobs[0].argv
    assert head[head.index("--disaggregation-mode") + 1] == "prefill"
    assert head[head.index("--disaggregation-bootstrap-port") + 1] == "18998"
    assert head[head.index("--port") + 1] == "18000" and "--disaggregation-decode-enable-radix-cache" not in head
    d = dec_jobs[0].argv
    assert d[d.index("--disaggregation-mode") + 1] == "decode" and d[d.index("--port") + 1] == "18001"
    assert "--disaggregation-decode-enable-radix-cache" in d
    # Rendezvous ports apart (both instances could share one machine), every rank under its own log name.
    assert pre_jobs[0].argv[pre_jobs[0].argv.index("--dist-init-addr") + 1] == "127.0.0.1:29500"
    assert d[d.index("--dist-init-addr") + 1] == "127.0.0.3:29501"
    assert dec_jobs[1].log_path.endswith("k3-pd-decode0-rank1.log")
    # A role alone has no pair for a completion: its head is ready on its health paths; the router's is asked
    # for the completion.
    assert (pre_jobs[0].ready.kind, dec_jobs[0].ready.kind) == ("health", "health")
    assert pre_jobs[0].ready.url == "http://127.0.0.1:18000"
    assert unit.router is not None
    router = unit.router.jobs[0]
    assert (unit.router.name, router.ready.kind) == ("k3-pd-router", "http")
    argv = list(router.argv)
    assert "--pd-disaggregation" in argv
    assert argv[argv.index("--prefill") + 1:argv.index("--prefill") + 3] == ["http://127.0.0.1:18000", "18998"]
    assert argv[argv.index("--decode") + 1] == "http://127.0.0.3:18001"


def test_the_router_fronts_the_ready_instances_and_a_role_without_one_is_refused(tmp_path: Path) -> None:
    unit = _unit(tmp_path, decodes=2)
    assert unit.roles == ("prefill", "decode", "decode")
    assert [p.name for p in unit.instances] == ["k3-pd-prefill0", "k3-pd-decode0", "k3-pd-decode1"]
    assert unit.plan.router is not None and unit.router is not None
    settings = unit.plan.router.settings
    every = unit.router.jobs[0].argv
    assert every.count("--decode") == 2, every
    argv = list(fronting_only(unit.router.jobs[0], settings, [settings.worker_urls[0], settings.worker_urls[2]]).argv)
    assert argv.count("--decode") == 1 and argv[argv.index("--decode") + 1] == "http://127.0.0.4:18002", argv
    assert argv[argv.index("--prefill") + 1] == "http://127.0.0.1:18000", argv

    class Down(LocalExecutor):
        def connect(self) -> None:
            raise ExecError("down", host=self.host)

    def factory(target: ExecTarget) -> LocalExecutor:
        return Down(target.host)

    # Every start fails: the first role without a ready instance is named, with why each instance failed.
    with pytest.raises(LaunchError, match=r"no prefill instance became ready \(a request needs one of each\); "
                       r"k3-pd-prefill0: localhost: down.*; k3-pd-decode0: localhost: down; "
                       r"k3-pd-decode1: localhost: down$") as err:
        launch_service(unit, StateStore(tmp_path / "state"), factory=factory, skip_preflight=True)
    assert err.value.hint == "k3deploy logs k3-pd-prefill0"



def test_a_ready_prefill_without_a_ready_decode_is_refused_naming_the_decodes(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The start of each instance is its own deployment's launch (covered elsewhere); here only which ones became
    # ready decides: the prefill did, neither decode did.
    from k3deploy.launch import service

    unit = _unit(tmp_path, decodes=2)
    started: list[int] = []

    def start(u: Unit, index: int, store: StateStore, **_: object) -> None:
        started.append(index)
        if u.roles[index] == "decode":
            raise LaunchError(f"{u.instances[index].name} did not load")

    monkeypatch.setattr(service, "start_replica", start)
    store = StateStore(tmp_path / "state")
    with pytest.raises(LaunchError, match=r"no decode instance became ready \(a request needs one of each\); "
                       r"k3-pd-decode0: k3-pd-decode0 did not load; k3-pd-decode1: k3-pd-decode1 did not load$") as err:
        launch_service(unit, store, skip_preflight=True)
    assert sorted(started) == [0, 1, 2]
    assert err.value.hint == "k3deploy logs k3-pd-decode0"
    svc = json.loads((tmp_path / "state" / "services" / "k3-pd.json").read_text(encoding="utf-8"))
    assert [(r["name"], r["phase"]) for r in svc["replicas"]] == [
        ("k3-pd-prefill0", "stopped"), ("k3-pd-decode0", "failed"), ("k3-pd-decode1", "failed")], svc
    assert svc["status"] == "failed" and "no decode instance became ready" in svc["cause"], svc

def test_launch_dry_run_shows_each_instance_and_rollout_of_single_instances_refuses(tmp_path: Path) -> None:
    r = run_k3deploy("launch", str(LOCAL), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "# ===== prefill k3-pd-prefill0 =====" in r.stdout and "# ===== decode k3-pd-decode0 =====" in r.stdout
    assert "--pd-disaggregation" in r.stdout and "--prefill http://127.0.0.1:18000 18998" in r.stdout
    doc = json.loads(run_k3deploy("launch", str(LOCAL), "--dry-run", "--json").stdout)
    assert [len(r) for r in doc["replicas"]] == [2, 2]
    r = run_k3deploy("rollout", str(LOCAL), "--state-dir", str(tmp_path))  # one instance per role: refused
    assert r.returncode == 2 and "roles.prefill has a single instance" in r.stderr, r.stderr


def test_validate_of_roles_runs_node_stages_per_instance_and_request_stages_once(tmp_path: Path) -> None:
    r = run_k3deploy("validate", str(LOCAL), "--only", "kernels,short,effort", "--state-dir", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(s["name"], s["status"]) for s in doc["stages"]] == [
        ("kernels[prefill0]", "skip"), ("kernels[decode0]", "skip"), ("short", "skip"), ("effort", "skip")], doc
    assert "k3-pd-prefill0" in doc["stages"][0]["detail"] and doc["not_implemented"] == []
    text = run_k3deploy("validate", str(LOCAL), "--only", "kernels", "--state-dir", str(tmp_path))
    assert "kernels[decode0]" in text.stdout and "kernels[decode0]: skip" in text.stderr  # not eaten as markup
