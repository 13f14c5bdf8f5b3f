"""`k3deploy render` of prefill/decode roles: every instance's per-node files (its own role flags and ports)
and the router's PD command, as text, json or scripts; one sbatch job; one LeaderWorkerSet per role with
the router as a Deployment and Service."""
from __future__ import annotations

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs
from k3deploy.engines.exports import Format, RenderedFile
from k3deploy.engines.group_exports import Member, RouterPart, group_files, whole_group_files
from k3deploy.engines.router import RouterSettings
from k3deploy.errors import InputError
from k3deploy.topology.nodes import Node


def _label(inp: Inputs) -> str:
    assert inp.pd is not None
    return inp.topology.name.rsplit("-", 1)[-1]  # prefill0, decode1, ...


def _member(inp: Inputs) -> Member:
    assert inp.pd is not None
    return Member(inp, _label(inp), f"{_label(inp)} ({inp.topology.name}, {inp.pd.mode} over {inp.pd.backend})",
                  {"role": inp.pd.mode, "instance": _label(inp), "name": inp.topology.name,
                   "backend": inp.pd.backend, "bootstrap_port": inp.pd.bootstrap_port,
                   "side_channel_port": inp.pd.side_channel_port})


def export_pd(instances: list[Inputs], router: tuple[RouterSettings, str] | None, fmt: Format, *,
              role: str | None = None, node: int | None = None, vendor: VendorSpec | None = None,
              router_python: str = "python3", name: str | None = None,
              router_node: Node | None = None) -> tuple[RenderedFile, ...]:
    """The files of `fmt` for every instance (or only `role`'s, e.g. prefill or decode0) and the router's PD
    command (left out when one role or node is asked for). `name`: the deployment's."""
    chosen = [i for i in instances if role is None or _label(i) == role or (i.pd and i.pd.mode == role)]
    if not chosen:
        known = ", ".join(["prefill", "decode", *(_label(i) for i in instances)])
        raise InputError(f"--role {role}: no such role or instance (one of {known})")
    base = name or instances[0].topology.name.rsplit("-", 1)[0]
    if fmt in ("slurm", "lws"):
        if role is not None or node is not None:
            raise InputError(f"--format {fmt} covers every role and the router; drop --role and --node")
        return whole_group_files(fmt, base, instances, router[0] if router is not None else None,
                                 labels=[_label(i) for i in instances], router_python=router_python,
                                 router_node=router_node, vendor=vendor)
    part = None
    if router is not None and role is None and node is None:
        s, runs_on = router
        part = RouterPart(s, f"router {s.kind} (PD mode) on {runs_on}: {s.url}",
                          f"router {s.kind} on {runs_on}: {s.url} -> {' '.join(s.worker_urls)}",
                          {"kind": s.kind, "runs_on": runs_on, "url": s.url,
                           "prefill": [[u, p] for u, p in s.prefill], "decode": list(s.decode)}, router_python)
    return group_files([_member(i) for i in chosen], part, fmt, key="instances", json_name="roles.json", node=node,
                       vendor=vendor)
