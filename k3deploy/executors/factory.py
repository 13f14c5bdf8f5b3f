"""Open the executor a target names (paramiko is imported only for ssh targets, ray only for ray)."""
from __future__ import annotations

from collections.abc import Callable

from k3deploy.executors.base import Executor
from k3deploy.executors.target import ExecTarget

ExecutorFactory = Callable[[ExecTarget], Executor]


def open_executor(target: ExecTarget) -> Executor:
    """A not-yet-connected Executor for the target (imports paramiko only for ssh)."""
    if target.kind == "local":
        from k3deploy.executors.local import LocalExecutor

        return LocalExecutor(target.host)
    if target.kind == "ssh":
        from k3deploy.executors.ssh import SshExecutor

        return SshExecutor(target)
    from k3deploy.errors import InputError

    if target.kind == "ray":
        from k3deploy.executors.ray_exec import RayExecutor  # without Ray: the CLI names the install

        return RayExecutor(target)

    raise InputError(f"executor '{target.kind}' is not available yet", hint="use --executor ssh or local")
