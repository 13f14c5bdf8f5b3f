"""`k3deploy render` of prefill/decode roles: every instance's per-node files (its own role flags and ports)
and the router's PD command, as text, json or scripts. Slurm and LWS exports of roles are not built: they are
refused, naming the formats that are."""
from __future__ import annotations

import json
from typing import Any

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs
from k3deploy.engines.exports import PER_NODE_FORMATS, Format, RenderedFile, export
from k3deploy.engines.replica_exports import router_script
from k3deploy.engines.router import RouterSettings, router_argv
from k3deploy.engines.shell import command_text
from k3deploy.errors import InputError


def _label(inp: Inputs) -> str:
    assert inp.pd is not None
    return inp.topology.name.rsplit("-", 1)[-1]  # prefill0, decode1, ...


def export_pd(instances: list[Inputs], router: tuple[RouterSettings, str] | None, fmt: Format, *,
              role: str | None = None, node: int | None = None, vendor: VendorSpec | None = None,
              router_python: str = "python3") -> tuple[RenderedFile, ...]:
    """The files of `fmt` for every instance (or only `role`'s, e.g. prefill or decode0) and the router's PD
    command (left out when one role or node is asked for)."""
    if fmt not in PER_NODE_FORMATS:
        raise InputError(f"--format {fmt} of a topology with roles (prefill/decode) is not built yet; "
                         f"use one of {', '.join(PER_NODE_FORMATS)}")
    chosen = [i for i in instances if role is None or _label(i) == role or (i.pd and i.pd.mode == role)]
    if not chosen:
        known = ", ".join(["prefill", "decode", *(_label(i) for i in instances)])
        raise InputError(f"--role {role}: no such role or instance (one of {known})")
    with_router = router is not None and role is None and node is None
    if fmt == "json":
        doc: dict[str, Any] = {"instances": []}
        for inp in chosen:
            assert inp.pd is not None
            nodes = json.loads(export(inp, "json", node=node, vendor=vendor)[0].content)["nodes"]
            doc["instances"].append({"role": inp.pd.mode, "instance": _label(inp), "name": inp.topology.name,
                                     "backend": inp.pd.backend, "bootstrap_port": inp.pd.bootstrap_port,
                                     "side_channel_port": inp.pd.side_channel_port, "nodes": nodes})
        if router is not None and with_router:
            s, runs_on = router
            doc["router"] = {"kind": s.kind, "runs_on": runs_on, "url": s.url,
                             "prefill": [[u, p] for u, p in s.prefill], "decode": list(s.decode),
                             "argv": list(router_argv(s, router_python))}
        return (RenderedFile("roles.json", json.dumps(doc, indent=2) + "\n"),)
    if fmt == "text":
        parts: list[str] = []
        for inp in chosen:
            assert inp.pd is not None
            parts.append(f"# ===== {_label(inp)} ({inp.topology.name}, {inp.pd.mode} over {inp.pd.backend}) =====")
            parts.append(export(inp, "text", node=node, vendor=vendor)[0].content)
        if router is not None and with_router:
            s, runs_on = router
            parts += [f"# ===== router {s.kind} (PD mode) on {runs_on}: {s.url} =====",
                      command_text(router_argv(s, router_python), indent="    "), ""]
        return (RenderedFile("commands.txt", "\n".join(parts)),)
    files = [RenderedFile(f"{_label(inp)}-{f.name}", f.content, f.executable)
             for inp in chosen for f in export(inp, "script", node=node, vendor=vendor)]
    if router is not None and with_router:
        files.append(RenderedFile("router.sh", router_script(*router, router_python), executable=True))
    return tuple(files)
