"""A Kubernetes LeaderWorkerSet manifest: leader = rank 0, workers pick their rank from LWS."""
from __future__ import annotations

import json
import re
from typing import Any

from k3deploy import __version__
from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.batch import case_branches
from k3deploy.engines.context import Inputs, Place, places
from k3deploy.engines.redact import secret_env
from k3deploy.engines.render import launch_spec, packaged_vendor
from k3deploy.engines.shell import expansion, has_marker, node_lines
from k3deploy.engines.spec import LaunchSpec
from k3deploy.errors import InputError

POD_IP_VAR = "K3_POD_IP"
# Image used when the topology names none (engine's official image for the pinned version).
DEFAULT_IMAGES = {"sglang": "lmsysorg/sglang:v{v}", "vllm": "vllm/vllm-openai:v{v}",
                  "vllm-ascend": "quay.io/ascend/vllm-ascend:v{v}", "sim": "k3deploy:" + __version__}
# The accelerator's own K3 build where the engine's generic image would not run on it: SGLang's ROCm K3 image
# (the K3 guide, section 37: lmsysorg/sglang-rocm for MI35x) and vLLM-Ascend's A3 image (its Kimi-K3 tutorial, 4.1).
VENDOR_IMAGES = {("sglang", "amd"): "lmsysorg/sglang-rocm:rocm720-mi35x-k3-20260727",
                 ("vllm-ascend", "huawei"): "quay.io/ascend/vllm-ascend:nightly-main-a3"}
DEVICE_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "huawei": "huawei.com/Ascend910"}
SHM_SIZE = "32Gi"


def k8s_name(name: str, suffix: str = "", *, limit: int = 63) -> str:
    """A DNS-1035 label (a letter first: LWS's webhook requires it of a LeaderWorkerSet, whose headless Service
    takes its name) from the deployment name, ending in `suffix`, at most `limit` characters."""
    base = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "k3deploy"
    if not base[0].isalpha():
        base = f"k3-{base}"
    return base[:limit - len(suffix)].rstrip("-") + suffix


def lws_name(name: str, suffix: str = "", *, replicas: int = 1) -> str:
    """A LeaderWorkerSet's name: a DNS-1035 label short enough that group i's worker StatefulSet NAME-i keeps
    its pods' revision label (NAME-i-<10-character hash>) within 63 characters (LWS's troubleshooting guide,
    "Unable to Create LWS Object with a Name Exceeding 51 Characters"; kubernetes#64023)."""
    return k8s_name(name, suffix, limit=63 - 11 - 1 - len(str(max(replicas - 1, 0))))


def lws_image(inp: Inputs) -> tuple[str, str | None]:
    """(image, note): the topology's image, else the engine's official one with a note to pin it."""
    e = inp.topology.engine
    if e.image:
        return e.image, None if "@sha256:" in e.image else "image not pinned by digest"
    image = VENDOR_IMAGES.get((e.kind, inp.hardware.vendor)) or DEFAULT_IMAGES[e.kind].format(
        v=inp.table.engine.split()[-1])
    return image, f"engine.image not set: defaulted to {image} (set and pin it by digest)"


def _env(t_secrets: dict[str, str], spec: LaunchSpec, secret_name: str) -> list[dict[str, Any]]:
    pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    env: list[dict[str, Any]] = [{"name": POD_IP_VAR, "valueFrom": pod_ip}]
    hidden = [k for k, v in spec.env.items() if secret_env(k, v)] + list(t_secrets)
    for name in hidden:  # secrets come from a Kubernetes Secret, never from the manifest
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": name,
                                                                   "optional": True}}})
    return env


def _container(inp: Inputs, spec: LaunchSpec, script: str, image: str, secret_name: str,
               leader: bool) -> dict[str, Any]:
    t = inp.topology
    c: dict[str, Any] = {"name": "engine", "image": image, "command": ["/bin/sh", "-c", script],
                         "env": _env(dict(t.engine.secrets), spec, secret_name)}
    resource = DEVICE_RESOURCES.get(inp.hardware.vendor)
    if resource:
        c["resources"] = {"limits": {resource: t.hardware.gpus_per_node}}
    c["volumeMounts"] = [{"name": "model", "mountPath": t.model.path, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}]
    if leader:
        c["ports"] = [{"containerPort": t.engine.port, "name": "http"}]
        c["readinessProbe"] = {"httpGet": {"path": "/health", "port": t.engine.port},
                               "periodSeconds": 10, "failureThreshold": 3}
    return c


def _pod(name: str, inp: Inputs, container: dict[str, Any], role: str) -> dict[str, Any]:
    return {"metadata": {"labels": {"app.kubernetes.io/name": name, "role": role}},
            "spec": {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", "containers": [container],
                     "volumes": [{"name": "model", "hostPath": {"path": inp.topology.model.path,
                                                                "type": "Directory"}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]}}


def lws_specs(inp: Inputs, vendor: VendorSpec | None) -> tuple[LaunchSpec, ...]:
    """Every rank's spec with the pod's own IP and the leader address as shell expansions."""
    out = []
    for p in places(inp.topology):
        templ = Place(rank=p.rank, nnodes=p.nnodes, ip=expansion(POD_IP_VAR),
                      head_ip=expansion("LWS_LEADER_ADDRESS"), iface=p.iface)
        out.append(launch_spec(inp, templ, vendor, docker=False))
    return tuple(out)


def lws_doc(inp: Inputs, vendor: VendorSpec | None, *, name: str, replicas: int = 1) -> dict[str, Any]:
    """One LeaderWorkerSet named `name` of `replicas` groups: group size = nodes, readiness probe on the
    leader, secrets from the Secret `name`-secrets."""
    t = inp.topology
    if has_marker(json.dumps(t.model_dump(mode="json"), ensure_ascii=False)):
        raise InputError("the topology contains private-use characters k3deploy reserves for templates")
    specs = lws_specs(inp, vendor if vendor is not None else packaged_vendor(inp.hardware.vendor))
    image, _ = lws_image(inp)
    secret_name = f"{name}-secrets"
    n = len(specs)
    # The commands below are rendered for n nodes: refuse to start in a group of another size.
    guard = (f': "${{{POD_IP_VAR}:?from the pod status}}" "${{LWS_LEADER_ADDRESS:?set by LeaderWorkerSet}}"\n'
             f'[ "${{LWS_GROUP_SIZE:?set by LeaderWorkerSet}}" = {n} ] || '
             f'{{ echo "k3deploy: rendered for {n} pods, LWS_GROUP_SIZE=${{LWS_GROUP_SIZE}}" >&2; exit 1; }}')
    leader_lines = node_lines(specs[0], redact=True, template=True, secrets=False)
    leader_script = "\n".join(["set -eu", guard, *leader_lines])
    worker_script = "\n".join(["set -eu", guard, 'case "${LWS_WORKER_INDEX:?set by LeaderWorkerSet}" in',
                               *case_branches(specs[1:], template=True, secrets=False),
                               "*)", '  echo "k3deploy: unexpected LWS_WORKER_INDEX=${LWS_WORKER_INDEX}" >&2',
                               "  exit 1", "  ;;", "esac"])
    template: dict[str, Any] = {
        "size": len(specs), "restartPolicy": "RecreateGroupOnPodRestart",
        "leaderTemplate": _pod(name, inp, _container(inp, specs[0], leader_script, image, secret_name, True),
                               "leader"),
    }
    if len(specs) > 1:
        template["workerTemplate"] = _pod(name, inp, _container(inp, specs[1], worker_script, image, secret_name,
                                                                False), "worker")
    else:
        template["workerTemplate"] = template.pop("leaderTemplate")
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name}, "spec": {"replicas": replicas, "startupPolicy": "LeaderCreated",
                                                 "leaderWorkerTemplate": template}}


def lws_manifest(inp: Inputs, vendor: VendorSpec | None = None) -> str:
    """LeaderWorkerSet YAML of one deployment (one group), with notes on how its pods find each other."""
    t = inp.topology
    name = lws_name(t.name)
    doc = lws_doc(inp, vendor, name=name)
    n = doc["spec"]["leaderWorkerTemplate"]["size"]
    _, note = lws_image(inp)
    notes = [f"# k3deploy: LeaderWorkerSet for deployment {t.name} ({n} pod(s), host network).",
             "# Rank = LWS_WORKER_INDEX, rendezvous = LWS_LEADER_ADDRESS, own IP = the pod IP, and the",
             f"# pods refuse to start unless LWS_GROUP_SIZE = {n}; the",
             "# topology's node IPs are not used. LeaderCreated: the leader turns ready only once every",
             "# worker has joined, so LeaderReady would never start the workers.",
             f"# Secrets: kubectl create secret generic {name}-secrets --from-literal=NAME=...",
             "# (every key is optional)."]
    if note:
        notes.append(f"# warning: {note}")
    return "\n".join(notes) + "\n" + dump_yaml(doc)


def dump_yaml(doc: dict[str, Any]) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
