"""LWS and Slurm exports of replicas and of prefill/decode roles: every Kubernetes object passes the real
Kubernetes schemas (kubernetes-validate's, strict; the LeaderWorkerSets the real LWS CRD's, tests/lws_schema.py),
the LeaderWorkerSets have the group counts and sizes of the topology, the router finds every group's leader by its stable name, and every router flag is in the
router's table (taken from its real parser)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.engines.router import argv_problems
from k3deploy.errors import InputError
from k3deploy.planning.rendering import render_files
from tests.k3deploy_cli import run_k3deploy
from tests.lws_schema import lws_errors
from tests.unit.test_render_support import ROOT, plan_file

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="dev extra: kubernetes-validate")

REPLICAS = ROOT / "topologies" / "replicas-h200-2x2x8-smg.yaml"
PD = [ROOT / "topologies" / "pd-h200-1p1d-sglang.yaml", ROOT / "topologies" / "pd-h200-1p1d-vllm.yaml"]
K8S = "1.30.0"


def docs(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(render_files(plan_file(path), "lws")[0].content))


def check_schemas(objs: list[dict[str, Any]]) -> None:
    """Deployment and Service as they are; each LWS pod template as a core/v1 PodTemplate (the CRD embeds
    PodTemplateSpec), strict: an unknown field is an error."""
    for o in objs:
        if o["kind"] == "LeaderWorkerSet":
            t = o["spec"]["leaderWorkerTemplate"]
            for key in ("leaderTemplate", "workerTemplate"):
                if key in t:
                    pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": o["metadata"]["name"]},
                           "template": t[key]}
                    kubernetes_validate.validate(pod, K8S, strict=True)
            assert lws_errors(o) == [], o["metadata"]["name"]
        else:
            kubernetes_validate.validate(o, K8S, strict=True)


def router_command(objs: list[dict[str, Any]]) -> list[str]:
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    argv: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    return argv


@pytest.mark.timeout(120)
def test_replicas_lws_is_one_leaderworkerset_of_n_groups_and_the_router_finds_each_leader() -> None:
    objs = docs(REPLICAS)
    assert [o["kind"] for o in objs] == ["LeaderWorkerSet", "Deployment", "Service"]
    check_schemas(objs)
    lws = objs[0]
    assert lws["spec"]["replicas"] == 2 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    argv = router_command(objs)
    assert argv[:3] == ["python3", "-m", "smg.launch_router"] and argv_problems("smg", tuple(argv[3:])) == []
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == ["http://k3-h200-replicas-0.k3-h200-replicas:8000",
                                 "http://k3-h200-replicas-1.k3-h200-replicas:8000"]
    svc = objs[2]
    assert svc["spec"]["selector"] == objs[1]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] != lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", PD, ids=lambda p: p.stem)
def test_roles_lws_is_one_leaderworkerset_per_role_and_the_router_is_in_pd_mode(path: Path) -> None:
    objs = docs(path)
    assert [o["kind"] for o in objs] == ["LeaderWorkerSet", "LeaderWorkerSet", "Deployment", "Service"]
    check_schemas(objs)
    prefill, decode = objs[0], objs[1]
    base = plan_file(path).topology.name
    assert prefill["metadata"]["name"] == f"{base}-prefill" and decode["metadata"]["name"] == f"{base}-decode"
    for lws in (prefill, decode):
        assert lws["spec"]["replicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    kind = "vllm-router" if "vllm" in path.stem else "smg"
    for lws, role in ((prefill, "prefill"), (decode, "decode")):
        leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"][2]
        assert (f"--disaggregation-mode {role}" if kind == "smg" else "NixlConnector") in leader
    argv = router_command(objs)
    assert argv_problems(kind, tuple(argv[3:])) == []
    i = argv.index("--prefill")
    assert argv[i + 1] == f"http://{base}-prefill-0.{base}-prefill:8000"
    if kind == "smg":
        assert argv[i + 2] == "8998"  # the bootstrap port the prefill listens on
    assert argv[argv.index("--decode") + 1] == f"http://{base}-decode-0.{base}-decode:8001"


@pytest.mark.timeout(60)
def test_a_pod_template_with_an_unknown_field_fails_the_schema_check() -> None:
    objs = docs(REPLICAS)
    objs[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["imagePullPolice"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_schemas(objs)
    objs = docs(REPLICAS)
    objs[2]["spec"]["ports"][0]["port"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_schemas(objs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", [REPLICAS, *PD], ids=lambda p: p.stem)
def test_slurm_job_runs_every_instance_as_its_own_step_and_the_router_where_runs_on_says(path: Path) -> None:
    text = render_files(plan_file(path), "slurm")[0].content
    plan = plan_file(path)
    assert "#SBATCH --nodes=4" in text and text.rstrip().endswith("wait")
    steps = [line for line in text.splitlines() if line.startswith("srun --nodes=2")]
    assert [s.split("--relative=")[1].split()[0] for s in steps] == ["0", "2"]
    assert all("--kill-on-bad-exit=1" in s and s.endswith("&") for s in steps)
    assert plan.router is not None and plan.topology.router is not None
    if plan.topology.router.runs_on == "local":  # not in the job: its command printed (test_slurm_router_place.py)
        (router,) = [line for line in text.splitlines() if line.startswith("printf '%s\\n' ")]
        assert "http://${K3_HEAD_IP_0}:8000" in router and "${K3_HEAD_IP_1}" in router
    else:
        (router,) = [line for line in text.splitlines() if line.startswith("srun --overlap")]
        assert '"${K3_HEAD_IP_0}":8000' in router and '"${K3_HEAD_IP_1}"' in router
    assert f"--port {plan.router.settings.port}" in router


@pytest.mark.timeout(60)
def test_a_selection_with_slurm_or_lws_is_refused() -> None:
    for fmt in ("slurm", "lws"):
        with pytest.raises(InputError, match="covers every replica"):
            render_files(plan_file(REPLICAS), fmt, replica=1)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="covers every role"):
            render_files(plan_file(PD[0]), fmt, role="decode")  # type: ignore[arg-type]
    r = run_k3deploy("render", str(REPLICAS), "--format", "lws", "--replica", "0")
    assert r.returncode == 2 and "drop --replica" in r.stderr, r.stderr
