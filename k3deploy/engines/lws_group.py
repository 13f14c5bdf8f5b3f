"""Kubernetes exports of several instances behind a router: replicas as one LeaderWorkerSet of N groups,
prefill/decode roles as one LeaderWorkerSet per role, and the router as a Deployment and a Service.

The router reaches each group's leader by the stable name LWS gives it: the leader pod of group i is
NAME-i, in the LeaderWorkerSet's headless service NAME (subdomainPolicy Shared, LWS's default), so
NAME-i.NAME resolves in the namespace whatever node the group lands on. Static names need no RBAC;
the routers' --service-discovery would need a ServiceAccount allowed to list pods."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs
from k3deploy.engines.lws import dump_yaml, lws_doc, lws_image, lws_name
from k3deploy.engines.router import RouterSettings, router_argv

ROUTER_PYTHON = "python3"  # the router image's interpreter (the topology's router.python is a host path)


def leader_url(lws: str, group: int, port: int) -> str:
    """The engine URL of one group's leader, by its stable DNS name."""
    return f"http://{lws}-{group}.{lws}:{port}"


def _router_docs(name: str, s: RouterSettings, image: str) -> list[dict[str, Any]]:
    """The router's Deployment (one pod, readiness from the router's own /readiness) and its Service."""
    def labels() -> dict[str, str]:  # a fresh dict each time: a shared one is dumped as a YAML alias
        return {"app.kubernetes.io/name": name, "role": "router"}

    container = {"name": "router", "image": image, "command": list(router_argv(s, ROUTER_PYTHON)),
                 "ports": [{"containerPort": s.port, "name": "http"},
                           {"containerPort": s.prometheus_port, "name": "metrics"}],
                 "readinessProbe": {"httpGet": {"path": "/readiness", "port": s.port}, "periodSeconds": 10,
                                    "failureThreshold": 3},
                 "livenessProbe": {"httpGet": {"path": "/liveness", "port": s.port}, "periodSeconds": 10,
                                   "failureThreshold": 6}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": f"{name}-router", "labels": labels()},
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels()},
                           "template": {"metadata": {"labels": labels()}, "spec": {"containers": [container]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-router", "labels": labels()},
               "spec": {"selector": labels(), "ports": [{"name": "http", "port": s.port, "targetPort": s.port}]}}
    return [deployment, service]


def _manifest(notes: list[str], docs: list[dict[str, Any]], inputs: Sequence[Inputs]) -> str:
    warnings = sorted({f"# warning: {note}" for inp in inputs if (note := lws_image(inp)[1])})
    return "\n".join([*notes, *warnings]) + "\n" + "---\n".join(dump_yaml(d) for d in docs)


def _router_notes(name: str, s: RouterSettings, image: str) -> list[str]:
    return [f"# The router ({s.kind}, `python3 -m {router_argv(s)[2]}`) runs from the image",
            f"# {image}, which must have it installed. Clients call the Service {name}-router on port {s.port}.",
            "# Secrets: kubectl create secret generic NAME-secrets --from-literal=KEY=... per LeaderWorkerSet",
            "# (every key is optional). Host network: each group takes whole nodes."]


def lws_replicas(base: str, replicas: Sequence[Inputs], router: RouterSettings | None,
                 vendor: VendorSpec | None = None) -> str:
    """One LeaderWorkerSet with `replicas: N` (replica 0's commands: every group is alike) and the router."""
    name = lws_name(base, replicas=len(replicas))
    first = replicas[0]
    docs = [lws_doc(first, vendor, name=name, replicas=len(replicas))]
    size = docs[0]["spec"]["leaderWorkerTemplate"]["size"]
    notes = [(f"# k3deploy: {len(replicas)} replicas of {base} as one LeaderWorkerSet {name} "
              f"(replicas: {len(replicas)}, {size} pod(s) each)"),
             "# Every group runs replica 0's commands (its ports); rank = LWS_WORKER_INDEX, rendezvous =",
             "# LWS_LEADER_ADDRESS (the group's own leader)."]
    if router is not None:
        image = lws_image(first)[0]
        urls = tuple(leader_url(name, i, first.topology.engine.port) for i in range(len(replicas)))
        s = dataclasses.replace(router, listen="0.0.0.0", worker_urls=urls)
        notes += [f"# The router reaches replica i at http://{name}-i.{name}:{first.topology.engine.port}.",
                  *_router_notes(name, s, image)]
        docs += _router_docs(name, s, image)
    return _manifest(notes, docs, replicas)


def lws_roles(base: str, instances: Sequence[Inputs], router: RouterSettings | None,
              vendor: VendorSpec | None = None) -> str:
    """One LeaderWorkerSet per role (replicas = its instances, instance 0's commands) and the PD router."""
    name = lws_name(base)  # the router's Deployment and Service are NAME-router
    docs: list[dict[str, Any]] = []
    notes = [f"# k3deploy: prefill/decode roles of {base}: one LeaderWorkerSet per role"]
    urls: dict[str, list[str]] = {}
    for role in ("prefill", "decode"):
        members = [i for i in instances if i.pd is not None and i.pd.mode == role]
        if not members:
            continue
        role_name = lws_name(base, f"-{role}", replicas=len(members))
        doc = lws_doc(members[0], vendor, name=role_name, replicas=len(members))
        docs.append(doc)
        notes.append(f"# {role_name}: replicas: {len(members)}, {doc['spec']['leaderWorkerTemplate']['size']} pod(s) "
                     f"each, every group with {role} instance 0's commands (its ports)")
        urls[role] = [leader_url(role_name, g, members[0].topology.engine.port) for g in range(len(members))]
    if router is not None:
        image = lws_image(instances[0])[0]
        bootstrap = router.prefill[0][1] if router.prefill else None
        s = dataclasses.replace(router, listen="0.0.0.0", worker_urls=(),
                                prefill=tuple((u, bootstrap) for u in urls.get("prefill", [])),
                                decode=tuple(urls.get("decode", [])))
        notes += ["# The router (PD mode) reaches each group's leader at NAME-ROLE-i.NAME-ROLE.",
                  *_router_notes(name, s, image)]
        docs += _router_docs(name, s, image)
    return _manifest(notes, docs, instances)
