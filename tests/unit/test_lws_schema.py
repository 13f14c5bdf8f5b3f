"""Every LeaderWorkerSet `render --format lws` writes (single deployments, replicas, prefill/decode roles; every
topology in topologies/ and the local replicas/roles assets) passes the real LWS CRD schema (tests/lws_schema.py:
kubernetes-sigs/lws v0.10.0, strict about unknown fields) and the name LWS accepts; the check fails on an
unknown field, a wrong type, a value outside its enum or width, a duplicate list key and a bad name."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.engines.exports import export
from k3deploy.planning.rendering import render_files
from tests.lws_schema import lws_errors, mutated
from tests.unit.test_render_support import ROOT, TOPOLOGIES, plan_file, plan_of

pytest.importorskip("jsonschema", reason="dev extra: jsonschema")

ASSETS = sorted((ROOT / "tests" / "assets" / "replicas").glob("*.yaml")) + sorted(
    (ROOT / "tests" / "assets" / "pd").glob("*.yaml"))
REPLICAS = ROOT / "topologies" / "replicas-h200-2x2x8-smg.yaml"
LOCAL_REPLICAS, LOCAL_PD = ROOT / "tests" / "assets" / "replicas" / "local-2x2-smg.yaml", \
    ROOT / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"
LWT = "spec.leaderWorkerTemplate"


def leaderworkersets(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == "LeaderWorkerSet"]


def rendered(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(render_files(plan_file(path), "lws")[0].content))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", TOPOLOGIES + ASSETS, ids=lambda p: p.stem)
def test_every_rendered_leaderworkerset_passes_the_lws_crd_schema(path: Path) -> None:
    objs = leaderworkersets(rendered(path))
    roles = "\nroles:" in path.read_text(encoding="utf-8")
    assert len(objs) == (2 if roles else 1)
    for o in objs:
        assert lws_errors(o) == [], o["metadata"]["name"]
    if len(plan_file(path).topology.nodes) == 1:  # one pod per group: the worker template alone
        assert list(objs[0]["spec"]["leaderWorkerTemplate"]) == ["size", "restartPolicy", "workerTemplate"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("path", "value", "expected"), [
    (f"{LWT}.sizee", 2, "spec.leaderWorkerTemplate: Additional properties are not allowed ('sizee'"),
    (f"{LWT}.size", "2", "spec.leaderWorkerTemplate.size: '2' is not of type 'integer'"),
    (f"{LWT}.size", 2**31, "spec.leaderWorkerTemplate.size: 2147483648 is not a 'int32'"),
    (f"{LWT}.restartPolicy", "Always", "spec.leaderWorkerTemplate.restartPolicy: 'Always' is not one of"),
    ("spec.startupPolicy", "LeaderStarted", "spec.startupPolicy: 'LeaderStarted' is not one of"),
    ("spec.replicas", -1, "spec.replicas: -1 is less than the minimum of 0"),
    ("spec.networkConfig", {}, "spec.networkConfig: 'subdomainPolicy' is a required property"),
    (f"{LWT}.leaderTemplate.metadata.labelz", {}, "leaderTemplate.metadata: Additional properties are not allowed"),
    (f"{LWT}.leaderTemplate.spec.containers.0.imagePullPolice", "x",
     "leaderTemplate.spec.containers.0: Additional properties are not allowed ('imagePullPolice'"),
    (f"{LWT}.workerTemplate.spec.containers.0.env.1", {"name": "K3_POD_IP", "value": "x"},
     "workerTemplate.spec.containers.0.env: duplicate entry ['K3_POD_IP'] in a list of type map"),
    ("metadata.name", "2x8-h200", "metadata.name: '2x8-h200' is not a DNS-1035 label"),
    ("metadata.name", "k" * 51, "is longer than the 50 characters"),
], ids=lambda v: v if isinstance(v, str) and "." in v and " " not in v else None)
def test_the_check_fails_on_what_the_api_server_rejects(path: str, value: Any, expected: str) -> None:
    (lws,) = leaderworkersets(rendered(REPLICAS))
    assert lws_errors(lws) == []
    errors = lws_errors(mutated(lws, path, value))
    assert any(expected in e for e in errors), errors


@pytest.mark.timeout(60)
def test_a_duplicate_port_is_a_duplicate_only_with_the_same_protocol() -> None:
    (lws,) = leaderworkersets(rendered(REPLICAS))
    ports = f"{LWT}.leaderTemplate.spec.containers.0.ports"
    port = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["ports"][0]
    same = mutated(lws, ports, [port, {"containerPort": port["containerPort"], "name": "again"}])
    assert any("duplicate entry" in e for e in lws_errors(same))  # protocol defaults to TCP on both
    udp = mutated(lws, ports, [port, {"containerPort": port["containerPort"], "protocol": "UDP", "name": "udp"}])
    assert lws_errors(udp) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", [LOCAL_REPLICAS, LOCAL_PD], ids=lambda p: p.stem)
def test_a_name_lws_would_refuse_or_outgrow_becomes_a_label_it_takes(path: Path) -> None:
    """A deployment name may start with a digit and run to 63 characters; an LWS name may not (the webhook
    asks for a DNS-1035 label; a worker StatefulSet NAME-i past 52 characters gives pods an over-long label)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["name"] = "4x8_" + "Kimi-K3." * 7 + "end"
    objs = list(yaml.safe_load_all(render_files(plan_of(doc), "lws")[0].content))
    for o in leaderworkersets(objs):
        assert lws_errors(o) == [], o["metadata"]["name"]
        assert o["metadata"]["name"].startswith("k3-4x8-kimi-k3-kimi-k3")
    if path == LOCAL_PD:
        assert [o["metadata"]["name"].rsplit("-", 1)[1] for o in leaderworkersets(objs)] == ["prefill", "decode"]
    for o in objs:
        if o["kind"] in ("Deployment", "Service"):
            assert len(o["metadata"]["name"]) <= 63 and o["metadata"]["name"].endswith("-router")


@pytest.mark.timeout(60)
def test_a_single_deployment_named_with_a_digit_first_passes() -> None:
    doc = yaml.safe_load((ROOT / "topologies" / "local-demo.yaml").read_text(encoding="utf-8"))
    doc["name"] = "0-demo"
    (lws,) = leaderworkersets(list(yaml.safe_load_all(export(plan_of(doc).render_inputs(), "lws")[0].content)))
    assert lws["metadata"]["name"] == "k3-0-demo" and lws_errors(lws) == []
