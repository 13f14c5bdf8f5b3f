"""Shared CLI plumbing: the one place errors become messages and exit codes."""
from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import typer

from k3deploy.errors import InputError, K3Error

if TYPE_CHECKING:
    from k3deploy.diagnostics import Issue
    from k3deploy.nodeplan.targets import ExecOverrides

CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option("--catalog", help="folder of extra catalog YAML files (adds or overrides entries by id)"),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="show tracebacks")]
FileArg = Annotated[Path, typer.Argument(help="topology YAML file", show_default=False)]

# The executor options of `launch` and `preflight`: the same parameter names as ExecOverrides' fields.
ExecutorOpt = Annotated[str | None, typer.Option("--executor", help="local | ssh | ray | slurm (default: launch.executor)")]
SshConfigOpt = Annotated[str, typer.Option("--ssh-config", help="ssh client config for host aliases")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-keys", help="trust and save host keys never seen before (changed keys are refused)")]
SshUserOpt = Annotated[str | None, typer.Option("--ssh-user", help="login user (over launch.ssh.user)")]
SshKeyOpt = Annotated[str | None, typer.Option("--ssh-key", help="private key (over launch.ssh.key)")]
KnownHostsOpt = Annotated[str | None, typer.Option(
    "--known-hosts", help="known_hosts file (over launch.ssh.known_hosts)")]
ConnectTimeoutOpt = Annotated[float | None, typer.Option(
    "--connect-timeout", help="seconds per SSH connection attempt (over launch.ssh.connect_timeout_s)")]
SshJumpOpt = Annotated[str | None, typer.Option(
    "--ssh-jump", help="jump host(s) like ssh -J: [user@]host[:port],... (over launch.ssh.jump; 'none' "
    "ignores ~/.ssh/config's ProxyJump)")]
RayAddressOpt = Annotated[str | None, typer.Option(
    "--ray-address", help="Ray cluster for --executor ray: auto, HOST:6379 or ray://HOST:10001 "
    "(over launch.ray_address)")]
_KW = inspect.Parameter.KEYWORD_ONLY
# The SSH and Ray options of every command that reaches nodes (launch, preflight, rollout), in --help order;
# `with_connection_options` gives them to a command.
CONNECTION_OPTIONS = (
    inspect.Parameter("accept_new_host_keys", _KW, annotation=AcceptNewOpt, default=False),
    inspect.Parameter("ssh_config", _KW, annotation=SshConfigOpt, default="~/.ssh/config"),
    inspect.Parameter("ssh_user", _KW, annotation=SshUserOpt, default=None),
    inspect.Parameter("ssh_key", _KW, annotation=SshKeyOpt, default=None),
    inspect.Parameter("known_hosts", _KW, annotation=KnownHostsOpt, default=None),
    inspect.Parameter("connect_timeout_s", _KW, annotation=ConnectTimeoutOpt, default=None),
    inspect.Parameter("ssh_jump", _KW, annotation=SshJumpOpt, default=None),
    inspect.Parameter("ray_address", _KW, annotation=RayAddressOpt, default=None),
)
# The options such a command ends with: the connection options are listed just before them.
TRAILING_OPTIONS = ("state_dir", "catalog")
EXEC_OPTIONS = ("executor", "ssh_user", "ssh_key", "known_hosts", "ssh_config", "accept_new_host_keys",
                "connect_timeout_s", "ray_address", "ssh_jump")
EXECUTORS = ("local", "ssh", "ray", "slurm")


Command = TypeVar("Command", bound=Callable[..., Any])


def with_connection_options(command: Command) -> Command:
    """Give `command` the CONNECTION_OPTIONS: typer sees each as an option of its own (its signature says so);
    the command takes them as `**connection` (for exec_overrides)."""
    sig = inspect.signature(command, eval_str=True)  # typer reads annotations from a set signature as they are
    own = [p.replace(kind=_KW) for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    at = next((i for i, p in enumerate(own) if p.name in TRAILING_OPTIONS), len(own))
    cast(Any, command).__signature__ = sig.replace(parameters=[*own[:at], *CONNECTION_OPTIONS, *own[at:]])
    return command


def exec_overrides(params: dict[str, object]) -> ExecOverrides:
    """The executor options among a command's parameters (its `locals()`), checked: ExecOverrides."""
    from k3deploy.nodeplan.targets import ExecOverrides
    from k3deploy.topology.nodes import check_jump

    executor = params["executor"]
    if executor is not None and executor not in EXECUTORS:
        raise InputError(f"--executor {executor}: expected {', '.join(EXECUTORS[:-1])} or {EXECUTORS[-1]}")
    jump = params["ssh_jump"]
    try:
        check_jump(jump if isinstance(jump, str) else None)
    except ValueError as exc:
        raise InputError(f"--ssh-jump: {exc}") from None
    return ExecOverrides.model_validate({k: params[k] for k in EXEC_OPTIONS})


def print_warnings(issues: Iterable[Issue], file: str) -> None:
    """Each warning as one stderr line, `warning: file:line:col: path: message (hint) [CODE]`."""
    for issue in issues:
        if issue.severity == "warning":
            print(f"warning: {issue.render(file)} [{issue.code}]", file=sys.stderr)


def debug_enabled() -> bool:
    """--debug anywhere on the command line, or K3DEPLOY_DEBUG=1."""
    return "--debug" in sys.argv or os.environ.get("K3DEPLOY_DEBUG") == "1"


def run_app(app: Any) -> int:
    """Run typer; map K3Error to its exit code with a one-paragraph message, never a traceback."""
    argv = [a for a in sys.argv[1:] if a != "--debug"]
    try:
        # Without standalone mode click returns the code of a typer.Exit instead of raising it.
        rc = app(args=argv, prog_name="k3deploy", standalone_mode=False)
        if rc == 130:  # typer >= 0.29 turns Ctrl-C into a silent Exit(130), which click returns here
            print("interrupted", file=sys.stderr)
        return rc if isinstance(rc, int) else 0
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except K3Error as exc:
        return _report(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every other error becomes a message and exit code
        code = _parser_error(exc)
        if code is not None:
            return code
        missing = _missing_dependency(exc)
        if missing is not None:
            return _report(missing, exc)
        if debug_enabled():
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc}\n(rerun with --debug for a traceback and report it)",
              file=sys.stderr)
        return 70


def _report(exc: K3Error, cause: BaseException | None = None) -> int:
    """Print a user error (and with --debug the traceback of what raised it); its exit code."""
    if debug_enabled():
        traceback.print_exception(cause or exc)
    msg = f"error: {exc}"
    if exc.hint:
        msg += f"\nhint: {exc.hint}"
    print(msg, file=sys.stderr)
    return exc.exit_code


def _missing_dependency(exc: BaseException) -> K3Error | None:
    """An optional package that is not installed, as a user error naming its install: the ImportError
    itself, or the cause of an error a library raised from it."""
    from k3deploy.extras import missing_dependency

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ImportError):
            return missing_dependency(cur)
        cur = cur.__cause__
    return None


def _parser_error(exc: Exception) -> int | None:
    """The exit code of typer's own exceptions (its vendored click's in typer >= 0.29, click's before):
    usage errors print themselves and exit 2; None for anything else."""
    kind = type(exc)
    if not kind.__module__.startswith(("typer", "click")):
        return None
    names = {c.__name__ for c in kind.__mro__}
    if "Exit" in names:
        return int(getattr(exc, "exit_code", 0))
    if "Abort" in names:
        print("aborted", file=sys.stderr)
        return 130
    if "ClickException" in names:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 2))
    return None
