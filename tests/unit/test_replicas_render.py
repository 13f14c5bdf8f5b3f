"""Replicas and the router rendered: the router's argv against its flag table, `render` of every replica and
the router (json, text, scripts), the plan and render CLI, `launch --dry-run`, the single-replica digest."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.engines.replica_exports import export_replicas
from k3deploy.engines.router import ROUTER_TABLES, RouterSettings, argv_problems, router_argv
from k3deploy.errors import InputError
from tests.k3deploy_cli import run_k3deploy
from tests.unit.test_replicas import LOCAL, ROOT, _doc, _plan

pytestmark = pytest.mark.timeout(60)


def _settings(kind: str) -> RouterSettings:
    return RouterSettings(kind=kind, listen="127.0.0.1", port=30000, worker_urls=("http://10.0.0.1:8000",
                          "http://10.0.0.3:8001"), policy="round_robin", health_failure_threshold=3,
                          health_success_threshold=2, health_check_interval_s=10, health_check_timeout_s=120,
                          startup_timeout_s=6000, metrics_port=30001)


@pytest.mark.parametrize("kind", sorted(ROUTER_TABLES))
def test_router_argv_passes_its_flag_table(kind: str) -> None:
    argv = router_argv(_settings(kind))
    assert argv[:2] == ("python3", "-m") and argv[2].endswith(".launch_router")
    assert argv_problems(kind, argv[3:]) == []
    # The exporter is bound beside the router (its default, 0.0.0.0:29000, collides between routers).
    joined = " ".join(argv)
    assert "--prometheus-host 127.0.0.1 --prometheus-port 30001" in joined
    assert argv_problems(kind, ("--policy", "no_such", "--no-such-flag", "--port", "x")) == [
        f"--policy: 'no_such' is not one of {', '.join(c for c in _choices(kind))}",
        f"{_table_name(kind)} has no flag --no-such-flag", "--port takes an integer, not 'x'"]


def _choices(kind: str) -> list[str]:
    raw = json.loads((ROOT / "k3deploy/engines/data/routers" / ROUTER_TABLES[kind]).read_text(encoding="utf-8"))
    return next(a["choices"] for a in raw["arguments"] if a["dest"] == "policy")


def _table_name(kind: str) -> str:
    return str(json.loads((ROOT / "k3deploy/engines/data/routers" / ROUTER_TABLES[kind]).read_text())["router"])


def test_render_every_replica_and_the_router() -> None:
    plan = _plan(_doc())
    assert plan.router is not None
    inputs = [plan.render_inputs(replica=i) for i in range(2)]
    router = (plan.router.settings, plan.router.runs_on)
    doc = json.loads(export_replicas(inputs, router, "json")[0].content)
    assert [r["name"] for r in doc["replicas"]] == ["k3-replicas-r0", "k3-replicas-r1"]
    heads = [r["nodes"][0]["argv"] for r in doc["replicas"]]
    for i, argv in enumerate(heads):
        assert argv[argv.index("--port") + 1] == str(18000 + i)
        assert argv[argv.index("--dist-init-addr") + 1] == f"127.0.0.{1 + 2 * i}:{29500 + i}"
    assert [len(r["nodes"]) for r in doc["replicas"]] == [2, 2]
    argv = doc["router"]["argv"]
    assert argv[2] == "smg.launch_router" and argv[argv.index("--worker-urls") + 1:][:2] == [
        "http://127.0.0.1:18000", "http://127.0.0.3:18001"]
    text = export_replicas(inputs, router, "text")[0].content
    assert "# ===== replica 1 (k3-replicas-r1) =====" in text and "router smg on local" in text
    names = [f.name for f in export_replicas(inputs, router, "script")]
    assert names == ["replica-0-node-0.sh", "replica-0-node-1.sh", "replica-1-node-0.sh", "replica-1-node-1.sh",
                     "router.sh"]
    only = json.loads(export_replicas(inputs, router, "json", replica=1, node=0)[0].content)
    assert [r["replica"] for r in only["replicas"]] == [1] and "router" not in only
    for fmt in ("slurm", "lws"):
        with pytest.raises(InputError, match=f"--format {fmt} covers every replica"):
            export_replicas(inputs, router, fmt, replica=0)  # type: ignore[arg-type]


def test_render_and_plan_cli(tmp_path: Path) -> None:
    r = run_k3deploy("render", str(LOCAL), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["replicas"]) == 2
    r = run_k3deploy("plan", "--json", str(LOCAL))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pool"]["replicas"] == 2 and doc["router"]["kind"] == "smg"
    bad = tmp_path / "bad.yaml"
    bad.write_text(LOCAL.read_text(encoding="utf-8").replace("replicas: 2", "replicas: 3"), encoding="utf-8")
    r = run_k3deploy("render", str(bad))
    assert r.returncode == 2 and f"{bad}:12:11: replicas: 4 nodes cannot be cut into 3" in r.stderr, r.stderr
    r = run_k3deploy("render", str(LOCAL), "--format", "slurm", "--node", "1")
    assert r.returncode == 2 and "covers every replica" in r.stderr, r.stderr


def test_launch_dry_run_of_replicas_shows_each_replica_and_the_router(tmp_path: Path) -> None:
    r = run_k3deploy("launch", str(LOCAL), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "# ===== replica k3-replicas-r0 =====" in r.stdout and "# ===== replica k3-replicas-r1 =====" in r.stdout
    assert "--port 18001" in r.stdout and "--dist-init-addr 127.0.0.3:29501" in r.stdout
    assert "-m smg.launch_router --host 127.0.0.1 --port 30000" in r.stdout
    assert "--prometheus-host 127.0.0.1 --prometheus-port 30001" in r.stdout
    doc = json.loads(run_k3deploy("launch", str(LOCAL), "--dry-run", "--json").stdout)
    assert [len(r) for r in doc["replicas"]] == [2, 2] and doc["router"]["ready"]["url"] == "http://127.0.0.1:30000"


def test_digest_of_a_single_replica_topology_is_unchanged_by_the_new_sections() -> None:
    from k3deploy.planning.files import catalog_for, plan_path

    plan = plan_path(ROOT / "topologies" / "local-demo.yaml", catalog_for(None)).plan
    assert plan is not None and plan.digest() == "01af361cfeb9e162"  # as main computes it without the replica sections
    assert _plan(_doc()).digest() != plan.digest()
