"""`k3deploy render` of several replicas behind a router: every replica's per-node files (each replica's own
ports) and the router's command, as text, json or scripts; one sbatch job; one LeaderWorkerSet of N groups
with the router as a Deployment and Service."""
from __future__ import annotations

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs
from k3deploy.engines.exports import Format, RenderedFile
from k3deploy.engines.group_exports import Member, RouterPart, group_files, whole_group_files
from k3deploy.engines.router import RouterSettings
from k3deploy.errors import InputError
from k3deploy.topology.nodes import Node


def _router_header(s: RouterSettings, runs_on: str) -> str:
    return f"router {s.kind} on {runs_on}: {s.url} -> {' '.join(s.worker_urls)}"


def export_replicas(replicas: list[Inputs], router: tuple[RouterSettings, str] | None, fmt: Format, *,
                    replica: int | None = None, node: int | None = None, vendor: VendorSpec | None = None,
                    router_python: str = "python3", name: str | None = None,
                    router_node: Node | None = None) -> tuple[RenderedFile, ...]:
    """The files of `fmt` for every replica (or only `replica`) and the router (`router`: its settings and
    where it runs; the router's part is left out when one replica is asked for). `name`: the deployment's."""
    if replica is not None and not 0 <= replica < len(replicas):
        raise InputError(f"--replica {replica}: no such replica (0..{len(replicas) - 1})")
    base = name or replicas[0].topology.name.rsplit("-r", 1)[0]
    if fmt in ("slurm", "lws"):
        if replica is not None or node is not None:
            raise InputError(f"--format {fmt} covers every replica and the router; drop --replica and --node")
        return whole_group_files(fmt, base, replicas, router[0] if router is not None else None,
                                 labels=[f"replica {i}" for i in range(len(replicas))], router_python=router_python,
                                 router_node=router_node, vendor=vendor)
    chosen = list(enumerate(replicas)) if replica is None else [(replica, replicas[replica])]
    members = [Member(inp, f"replica-{i}", f"replica {i} ({inp.topology.name})",
                      {"replica": i, "name": inp.topology.name}) for i, inp in chosen]
    part = None
    if router is not None and replica is None and node is None:
        s, runs_on = router
        part = RouterPart(s, _router_header(s, runs_on), _router_header(s, runs_on),
                          {"kind": s.kind, "runs_on": runs_on, "url": s.url, "worker_urls": list(s.worker_urls)},
                          router_python)
    return group_files(members, part, fmt, key="replicas", json_name="replicas.json", node=node, vendor=vendor)
