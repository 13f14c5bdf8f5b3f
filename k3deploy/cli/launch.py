"""`k3deploy launch`: bring a topology up on its nodes, gang-supervised."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from k3deploy.cli.common import CatalogOpt, print_warnings

ExecutorOpt = Annotated[str | None, typer.Option("--executor", help="local | ssh | ray (default: launch.executor)")]
StateDirOpt = Annotated[Path | None, typer.Option(
    "--state-dir", help="deployment records (default: launch.state_dir, else $XDG_STATE_HOME/k3deploy)")]
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
FileArg = Annotated[Path, typer.Argument(help="topology YAML file", show_default=False)]


def launch(
    file: FileArg,
    executor: ExecutorOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would run where; touch nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    attach: Annotated[bool, typer.Option("--attach", help="stay in the foreground streaming node logs; "
                                         "Ctrl-C stops the deployment")] = False,
    skip_preflight: Annotated[bool, typer.Option(
        "--skip-preflight", help="start without running `k3deploy preflight` first (recorded in the "
        "deployment record)")] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    ssh_config: SshConfigOpt = "~/.ssh/config",
    ssh_user: SshUserOpt = None,
    ssh_key: SshKeyOpt = None,
    known_hosts: KnownHostsOpt = None,
    connect_timeout_s: ConnectTimeoutOpt = None,
    ssh_jump: SshJumpOpt = None,
    ray_address: RayAddressOpt = None,
    state_dir: StateDirOpt = None,
    catalog: CatalogOpt = None,
) -> None:
    """Run preflight; start rank 0, then every worker; wait until rank 0 serves; leave a supervisor
    watching all nodes.

    A failed preflight check starts nothing (exit 4, naming the check, node and fix; --skip-preflight
    starts anyway and records it). Any node exiting, the readiness deadline or Ctrl-C stops every node and
    names the one that failed first (exit 4; 3 when a host cannot be reached; 5 when the deployment already
    runs)."""
    plan, jobs, cat = prepare(file, catalog, exec_options(locals()))
    if dry_run:
        _print_dry_run(jobs, as_json)
        return
    _launch(plan, jobs, state_dir, as_json, attach, None if skip_preflight else cat)


# The command-line parameters that become ExecOverrides (same names), shared by launch and preflight.
EXEC_OPTIONS = ("executor", "ssh_user", "ssh_key", "known_hosts", "ssh_config", "accept_new_host_keys",
                "connect_timeout_s", "ray_address", "ssh_jump")


def exec_options(params: dict[str, Any]) -> dict[str, Any]:
    """The executor options among a command's parameters."""
    return {k: params[k] for k in EXEC_OPTIONS}


def prepare(file: Path, catalog: list[Path] | None, options: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Check the executor options (ExecOverrides fields), plan the file (feasible), warn about secrets,
    render the jobs: (plan, jobs, catalog). Shared by launch and preflight."""
    from k3deploy.engines.secret_refs import secret_warnings
    from k3deploy.errors import InputError
    from k3deploy.launch.jobs import jobs_for
    from k3deploy.launch.targets import ExecOverrides
    from k3deploy.planning.files import catalog_for, require_feasible
    from k3deploy.topology.nodes import check_jump

    executor = options.get("executor")
    if executor not in (None, "local", "ssh", "ray"):
        raise InputError(f"--executor {executor}: expected local, ssh or ray")
    try:
        check_jump(options.get("ssh_jump"))
    except ValueError as exc:
        raise InputError(f"--ssh-jump: {exc}") from None
    cat = catalog_for(catalog)
    plan = require_feasible(file, cat)
    if plan.topology.replicas > 1 or plan.topology.router is not None:
        raise InputError(f"{plan.file}: launching replicas or a router is not built yet (issue 26)",
                         hint=f"`k3deploy render {plan.file}` gives every replica's and the router's command")
    print_warnings(secret_warnings(plan.topology, os.environ, executor), plan.file)
    jobs = jobs_for(plan, ExecOverrides(**options), cat)
    return plan, jobs, cat


def _print_dry_run(jobs: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps([j.model_dump(mode="json") for j in jobs], indent=2))
        return
    from rich.console import Console

    from k3deploy.launch.views import dry_run

    Console(highlight=False, soft_wrap=True).print(dry_run(jobs))


def _launch(plan: Any, jobs: Any, state_dir: Path | None, as_json: bool, attach: bool, catalog: Any) -> None:
    """Launch; `catalog` None means --skip-preflight."""
    from rich.console import Console
    from rich.live import Live

    from k3deploy.launch import deploy
    from k3deploy.launch.state import StateStore, default_state_dir
    from k3deploy.launch.views import Progress, deployment_summary, event_line

    store = StateStore(state_dir or plan.topology.launch.state_dir or default_state_dir())
    err = Console(stderr=True, highlight=False)
    progress = Progress(jobs)
    live = Live(progress.table(), console=err, refresh_per_second=4, get_renderable=progress.table) \
        if err.is_terminal and not as_json else None

    def on_event(event: Any) -> None:
        progress.update(event)
        if live is None and not as_json:
            err.print(event_line(event), markup=False)

    _sigterm_interrupts()
    try:
        if live is not None:
            live.start()
        dep = deploy.launch(plan, jobs, store, on_event=on_event, background=not attach,
                            preflight_catalog=catalog, skip_preflight=catalog is None)
    except BaseException:
        if as_json:
            rec = store.load(plan.topology.name)
            print(rec.model_dump_json(indent=2) if rec is not None else "{}")
        raise
    finally:
        if live is not None:
            live.stop()
    if as_json and not attach:
        print(dep.model_dump_json(indent=2))
    else:
        err.print(deployment_summary(dep), markup=False)
    if attach:
        _attach(store, plan.topology.name, err)


def _attach(store: Any, name: str, err: Any) -> None:
    """Supervise in the foreground while streaming node-prefixed logs; Ctrl-C stops the deployment."""
    from k3deploy.launch import deploy
    from k3deploy.launch.streaming import LogStreamer
    from k3deploy.launch.supervisor import Supervisor
    from k3deploy.launch.views import event_line

    sup = Supervisor(store, name, on_event=lambda e: err.print(event_line(e), markup=False))
    streamer: LogStreamer | None = None
    fleet = deploy.fleet_of(store.require(name).jobs)

    def handles() -> dict[int, Any]:
        return dict(sup.gang.handles) if sup.gang is not None else {}

    def sink(rank: int, host: str, line: str) -> None:
        sys.stdout.write(f"[{rank} {host}] {line}\n")
        sys.stdout.flush()

    streamer = LogStreamer(fleet, handles, sink).start()
    try:
        final = sup.run()
    except KeyboardInterrupt:
        err.print("stopping every node ...")
        streamer.stop()
        deploy.stop(store, name)
        raise
    finally:
        streamer.stop()
        fleet.close()
    if final.status == "failed":
        from k3deploy.launch.gang import GroupFailed

        if final.failure is not None:
            raise GroupFailed(final.failure)


def _sigterm_interrupts() -> None:
    """`k3deploy stop` from another shell sends SIGTERM: unwind like Ctrl-C, stopping started nodes."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
