"""`k3deploy render` outputs: text, json, per-node scripts, an sbatch script, an LWS manifest."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs
from k3deploy.engines.redact import REDACTED, redact_argv, redact_env
from k3deploy.engines.render import packaged_vendor, render_nodes
from k3deploy.engines.secret_refs import node_secrets
from k3deploy.engines.shell import command_text
from k3deploy.engines.spec import LaunchSpec
from k3deploy.errors import InputError

Format = Literal["text", "json", "script", "slurm", "lws"]
FORMATS: tuple[Format, ...] = ("text", "json", "script", "slurm", "lws")
PER_NODE_FORMATS = ("text", "json", "script")


@dataclass(frozen=True)
class RenderedFile:
    """One output file: its name under --out, its text, whether it is executable."""

    name: str
    content: str
    executable: bool = False


def node_json(spec: LaunchSpec, executor: str) -> dict[str, Any]:
    """One node for `--format json` (argv as executed, credentials redacted; plain values in `env`,
    engine.secrets as references in `secrets`, with where the node resolves each)."""
    return {"rank": spec.rank, "host": spec.host, "ip": spec.ip, "head": spec.head,
            "argv": list(redact_argv(spec.argv)), "env": redact_env(spec.env),
            "secrets": node_secrets(spec.secret_env, spec.host, executor),
            "ready": {"kind": spec.ready.kind, "url": spec.ready.url, "paths": list(spec.ready.paths)},
            "container": spec.container}


def json_text(specs: tuple[LaunchSpec, ...], executor: str) -> str:
    """{"nodes": [...]}."""
    return json.dumps({"nodes": [node_json(s, executor) for s in specs]}, indent=2) + "\n"


def node_header(spec: LaunchSpec) -> str:
    """`rank 0  host gpu-a  ip 10.0.0.10  head` (hosts and IPs are validated plain words)."""
    role = "head" if spec.head else ("headless worker" if spec.headless else "worker")
    return f"rank {spec.rank}  host {spec.host}  ip {spec.ip}  {role}"


def text_text(specs: tuple[LaunchSpec, ...]) -> str:
    """Per node: a header line, env lines, readiness, and the quoted command."""
    out: list[str] = []
    for s in specs:
        out.append(f"# {node_header(s)}")
        ready = f"{s.ready.kind} {s.ready.url or ''} {' '.join(s.ready.paths)}".strip()
        out.append(f"# ready: {ready}" + (f"; container {s.container}" if s.container else ""))
        for k, v in redact_env(s.env).items():
            out.append(f"{k}={v if v == REDACTED else shlex.quote(v)}")
        for k, ref in s.secret_env.items():
            out.append(f"{k}=<{ref}>  # secret, resolved on the node")
        out.append(command_text(redact_argv(s.argv), indent="    "))
        out.append("")
    return "\n".join(out)


def select(specs: tuple[LaunchSpec, ...], node: int | None) -> tuple[LaunchSpec, ...]:
    """All nodes, or the one with rank `node`."""
    if node is None:
        return specs
    chosen = tuple(s for s in specs if s.rank == node)
    if not chosen:
        raise InputError(f"--node {node}: no such rank (ranks 0..{len(specs) - 1})")
    return chosen


def export(inp: Inputs, fmt: Format, *, node: int | None = None,
           vendor: VendorSpec | None = None) -> tuple[RenderedFile, ...]:
    """The files one format consists of (inputs from `Plan.render_inputs`)."""
    from k3deploy.engines.batch import node_script
    from k3deploy.engines.lws import lws_manifest
    from k3deploy.engines.slurm_job import job_text

    if fmt not in FORMATS:
        raise InputError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if node is not None and fmt not in PER_NODE_FORMATS:
        raise InputError(f"--node applies to {', '.join(PER_NODE_FORMATS)}; {fmt} covers the whole group")
    if fmt == "lws":
        return (RenderedFile("lws.yaml", lws_manifest(inp, vendor)),)
    if fmt == "slurm":
        vend = vendor if vendor is not None else packaged_vendor(inp.hardware.vendor)
        sbatch = job_text(inp, vend, gpus=inp.hardware.vendor in ("nvidia", "amd"))
        return (RenderedFile("k3deploy.sbatch", sbatch, executable=True),)
    specs = render_nodes(inp, vendor)
    specs = select(specs, node)
    if fmt == "json":
        return (RenderedFile("nodes.json", json_text(specs, inp.topology.launch.executor)),)
    if fmt == "text":
        return (RenderedFile("commands.txt", text_text(specs)),)
    return tuple(RenderedFile(f"node-{s.rank}.sh", node_script(inp.topology, s), executable=True)
                 for s in specs)


def stdout_text(files: tuple[RenderedFile, ...]) -> str:
    """What `render` prints without --out: the file, or every script under a header comment."""
    if len(files) == 1:
        return files[0].content
    return "\n".join(f"# ===== {f.name} =====\n{f.content}" for f in files)
