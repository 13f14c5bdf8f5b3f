"""Open the executor a target names (paramiko is imported only for ssh targets, ray only for ray)."""
from __future__ import annotations

from collections.abc import Callable

from k3deploy.executors.base import Executor
from k3deploy.executors.target import ExecTarget, LocalTarget, SshTarget

ExecutorFactory = Callable[[ExecTarget], Executor]


def open_executor(target: ExecTarget) -> Executor:
    """A not-yet-connected Executor for the target (imports paramiko only for ssh)."""
    if isinstance(target, LocalTarget):
        from k3deploy.executors.local import LocalExecutor

        return LocalExecutor(target.host)
    if isinstance(target, SshTarget):
        from k3deploy.executors.ssh import SshExecutor

        return SshExecutor(target)
    from k3deploy.executors.ray_exec import RayExecutor  # without Ray: the CLI names the install

    return RayExecutor(target)
