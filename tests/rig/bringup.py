"""Bringing a rig's hosts up and down: keys, the two networks, one sshd per host as PID 1 of its own PID
namespace (checked to be the only child of its `unshare`), and stopping them again."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .netns import MGMT_IFACE, PRIV_IFACE, NetNames, RigError, host_lines, root_lines, run_batches
from .sshd import (
    SSHD,
    ReadyTarget,
    keygen,
    known_hosts_line,
    launch,
    ssh_config_block,
    sshd_config,
    wait_ready,
)

MAX_HOSTS = 32


@dataclass(frozen=True)
class RigHost:
    """One fake host as tests see it."""

    name: str
    ns: str
    priv_ip: str
    mgmt_ip: str
    priv_iface: str = PRIV_IFACE
    mgmt_iface: str = MGMT_IFACE


HostRef = RigHost | str


@dataclass
class HostRuntime:
    proc: subprocess.Popen[bytes]  # `ip netns exec ... unshare ...`, parent of the sshd
    log: Path
    sshd_pid: int = 0  # root-namespace PID of the sshd (PID 1 inside the host)
    pid_ns: str = ""


@dataclass(frozen=True)
class RigFiles:
    """Where a rig keeps the client's key, its known_hosts and its ssh_config, under its work directory."""

    workdir: Path

    @property
    def key_path(self) -> Path:
        return self.workdir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def ssh_config_path(self) -> Path:
        return self.workdir / "ssh_config"


def start_hosts(names: NetNames, files: RigFiles, n: int, ready_timeout_s: float, ident: str, *,
                hosts: list[RigHost], runtime: dict[str, HostRuntime], timings: dict[str, float]) -> None:
    """Hosts h01..hNN up and accepting SSH; `hosts` and `runtime` fill as each starts (so a failed start
    leaves what must be stopped in them), `timings` gets each stage's seconds."""
    workdir = files.workdir
    t0 = time.monotonic()
    for i in range(1, n + 1):
        (workdir / f"h{i:02d}").mkdir()
    host_keys = [workdir / f"h{i:02d}" / "ssh_host_ed25519_key" for i in range(1, n + 1)]
    keygen([files.key_path, *host_keys], comment=f"{ident}")
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{files.key_path}.pub").read_text())
    timings["keys_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    errors = run_batches([(None, root_lines(names, n))])
    if not errors:
        errors = run_batches([(names.ns(i), host_lines(names, i)) for i in range(1, n + 1)])
    if errors:
        raise RigError("network setup failed: " + "; ".join(errors))
    timings["net_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # sshd's privsep dir
    known, config, targets = [], [], []
    for i in range(1, n + 1):
        host = RigHost(f"h{i:02d}", names.ns(i), names.priv_ip(i), names.mgmt_ip(i))
        hdir = workdir / host.name
        conf = hdir / "sshd_config"
        conf.write_text(sshd_config([host.mgmt_ip, host.priv_ip], host_keys[i - 1], authorized))
        known.append(known_hosts_line([host.mgmt_ip, host.priv_ip, host.name], host_keys[i - 1]))
        config.append(ssh_config_block(host.name, host.mgmt_ip, files.key_path, files.known_hosts_path))
        log = hdir / "sshd.log"
        proc = launch(host.ns, host.name, conf, log)
        runtime[host.name] = HostRuntime(proc, log)
        hosts.append(host)
        targets.append(ReadyTarget(host.name, [host.mgmt_ip, host.priv_ip], proc, log))
    files.known_hosts_path.write_text("".join(known))
    files.ssh_config_path.write_text("\n".join(config))
    wait_ready(targets, ready_timeout_s)
    kids_of = procs.children(rt.proc.pid for rt in runtime.values())
    for host in hosts:
        rt = runtime[host.name]
        kids = kids_of[rt.proc.pid]
        if len(kids) != 1 or procs.exe_path(kids[0]) != SSHD:
            raise RigError(f"{host.name}: expected one sshd under unshare, found {kids}")
        rt.sshd_pid, rt.pid_ns = kids[0], procs.ns_link(kids[0], "pid") or ""
    timings["sshd_s"] = time.monotonic() - t0


def stop_hosts(runtimes: list[HostRuntime]) -> None:
    """Kill each host's sshd (PID 1: the kernel kills the rest) and reap the unshare parents."""
    with procs.removing_ipc_dirs(p for rt in runtimes if rt.pid_ns for p in procs.pid_ns_members(rt.pid_ns)):
        for rt in runtimes:
            if rt.sshd_pid and procs.parent_pid(rt.sshd_pid) == rt.proc.pid:
                # Killing PID 1 first lets unshare reap it: no zombie left for the lazy system init.
                procs.send([rt.sshd_pid])
            elif rt.proc.poll() is None:
                rt.proc.kill()
        # Bounds for a loaded machine: the wait ends as soon as the kernel has emptied the namespace.
        deadline = time.monotonic() + 20.0
        for rt in runtimes:
            try:
                rt.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rt.proc.kill()  # unshare ignores SIGTERM; --kill-child takes the sshd with it
                rt.proc.wait(timeout=30.0)
