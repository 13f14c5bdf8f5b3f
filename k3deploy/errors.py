"""Error hierarchy; the CLI maps each class to a documented exit code."""
from __future__ import annotations


class K3Error(Exception):
    """Base of every error k3deploy reports to a user (never shown as a traceback)."""

    exit_code = 1
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class InputError(K3Error):
    """Bad YAML, schema violation, unknown catalog id, bad CLI option: exit 2."""

    exit_code = 2


class InfeasibleError(K3Error):
    """The plan is legal as input but cannot run (memory, shape): exit 1."""

    exit_code = 1


class ExecError(K3Error):
    """A host could not be reached or a remote command could not run: exit 3."""

    exit_code = 3

    def __init__(self, message: str, *, host: str | None = None, hint: str | None = None) -> None:
        self.host = host
        super().__init__(f"{host}: {message}" if host else message, hint=hint)


class CommandTimeout(ExecError):
    """A command on a host ran past its timeout (and was killed): exit 3."""


class LaunchError(K3Error):
    """A deployment failed to come up or was torn down: exit 4."""

    exit_code = 4


class StateError(K3Error):
    """The deployment record is missing, busy or inconsistent: exit 5."""

    exit_code = 5


class MissingDependency(K3Error):
    """An optional package the command needs is not installed here (k3deploy.extras names the install): exit 6."""

    exit_code = 6

    def __init__(self, message: str, *, hint: str | None = None, module: str | None = None) -> None:
        self.module = module
        super().__init__(message, hint=hint)


EXIT_CODES = {
    0: "success (plan feasible, deployment ready, validation passed)",
    1: "plan infeasible, or a validation stage failed",
    2: "invalid input: YAML, schema, catalog id, or command-line option",
    3: "host error: unreachable host, SSH authentication or host key, Ray connection",
    4: "launch failed: a node exited, readiness deadline passed, or the deployment was torn down; "
       "`status` of a deployment that failed",
    5: "state error: no such deployment, one is already running, or the state directory cannot be written",
    6: "missing dependency: a package this command needs is not installed here (the message names the install)",
    70: "internal error: a bug in k3deploy (rerun with --debug for the traceback and report it)",
    130: "interrupted (Ctrl-C); every node that was started has been stopped",
}
