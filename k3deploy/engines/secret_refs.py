"""Where each `engine.secrets` reference is resolved, and the secrets a node will get nothing for."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from k3deploy.diagnostics import Issue
from k3deploy.topology.schema import Topology
from k3deploy.topology.settings import nodes_are_here


def secret_source(ref: str, host: str, executor: str) -> str:
    """In words: where the node's engine process reads one reference from (never this machine over SSH)."""
    kind, _, src = ref.partition(":")
    here = nodes_are_here(executor)
    if kind == "file":
        return f"file {src} on this machine" if here else f"file {src} on node {host}"
    if here:
        return f"this machine's environment (the shell that runs k3deploy), variable {src}"
    via = {"ssh": "what the SSH login gives it", "ray": "the Ray worker's environment"}.get(executor, "its login")
    return f"the environment of the engine's process on node {host} ({via}), variable {src}"


def node_secrets(secret_env: Mapping[str, str], host: str, executor: str) -> list[dict[str, Any]]:
    """The `secrets` list of one node in `render --format json`: references only, never values."""
    return [{"name": name, "ref": ref, "resolved_on": "node", "source": secret_source(ref, host, executor)}
            for name, ref in secret_env.items()]


def secret_warnings(t: Topology, environ: Mapping[str, str], executor: str | None = None) -> list[Issue]:
    """Secrets the nodes will not get: missing here for local nodes, or set only here for remote ones
    (k3deploy never copies a value from this machine to a node)."""
    kind = executor or t.launch.executor
    here = nodes_are_here(kind)
    out: list[Issue] = []
    for name, ref in t.engine.secrets.items():
        what, _, src = ref.partition(":")
        path = f"engine.secrets.{name}"
        if here and what == "env" and not environ.get(src):
            out.append(Issue(code="SECRET_EMPTY", severity="warning", path=path,
                             message=f"{name} will be empty: {src} is not set in this machine's environment, "
                             "where local nodes read it", hint=f"export {src} before k3deploy launch"))
        elif here and what == "file" and not os.path.isfile(src):
            out.append(Issue(code="SECRET_EMPTY", severity="warning", path=path,
                             message=f"{name} will be empty: {src} does not exist on this machine",
                             hint="create the file, or point the reference at one that exists"))
        elif not here and what == "env" and environ.get(src):
            out.append(Issue(code="SECRET_NOT_SENT", severity="warning", path=path,
                             message=f"{src} is set on this machine but is not sent to the nodes: each node's "
                             f"engine reads {name} from its own environment ({kind})",
                             hint=f"set {src} on every node (e.g. in /etc/environment), or use a file: reference "
                             "to a file on the nodes"))
    return out
