"""HostRig: N fake hosts (netns + PID namespace + sshd) on two bridged networks, for integration tests."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import Self

from . import procs
from .netns import (
    MGMT_IFACE,
    PRIV_IFACE,
    NetNames,
    RigError,
    host_lines,
    read_counters,
    root_lines,
    run_batches,
)
from .registry import allocate, cleanup_stale, release
from .sshd import (
    SSHD,
    ReadyTarget,
    keygen,
    known_hosts_line,
    launch,
    log_tail,
    ssh_config_block,
    sshd_config,
    wait_ready,
)

if TYPE_CHECKING:
    import paramiko

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
class _HostRuntime:
    proc: subprocess.Popen[bytes]  # `ip netns exec ... unshare ...`, parent of the sshd
    log: Path
    sshd_pid: int = 0  # root-namespace PID of the sshd (PID 1 inside the host)
    pid_ns: str = ""


class HostRig:
    """Context manager building `n` hosts h01..hNN reachable over SSH from the root namespace."""

    def __init__(self, n: int = 4, *, prefix: str = "k3r", ready_timeout_s: float = 10.0) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}, got {n}")
        self.hosts: list[RigHost] = []
        self.timings: dict[str, float] = {}
        self._runtime: dict[str, _HostRuntime] = {}
        self._closed = False
        self._controller: str | None = None
        self._ident = ""
        t0 = time.monotonic()
        cleanup_stale(prefix)
        ident, subnet, workdir = allocate(prefix, Path(tempfile.gettempdir()))
        self._ident, self.subnet, self.workdir = ident, subnet, workdir
        atexit.register(self.close)
        self._names = NetNames(ident, subnet)
        self.key_path = workdir / "id_ed25519"
        self.known_hosts_path = workdir / "known_hosts"
        self.ssh_config_path = workdir / "ssh_config"
        self.root_priv_ip = self._names.root_ip("p")
        self.root_mgmt_ip = self._names.root_ip("m")
        try:
            self._build(n, ready_timeout_s)
        except BaseException:
            self.close()
            raise
        self.timings["up_s"] = time.monotonic() - t0

    @property
    def ident(self) -> str:
        """Unique name prefix of everything this rig creates (namespaces, links, files)."""
        return self._ident

    def _build(self, n: int, ready_timeout_s: float) -> None:
        names, workdir = self._names, self.workdir
        t0 = time.monotonic()
        for i in range(1, n + 1):
            (workdir / f"h{i:02d}").mkdir()
        host_keys = [workdir / f"h{i:02d}" / "ssh_host_ed25519_key" for i in range(1, n + 1)]
        keygen([self.key_path, *host_keys], comment=f"{self.ident}")
        authorized = workdir / "authorized_keys"
        authorized.write_text(Path(f"{self.key_path}.pub").read_text())
        self.timings["keys_s"] = time.monotonic() - t0

        t0 = time.monotonic()
        errors = run_batches([(None, root_lines(names, n))])
        if not errors:
            errors = run_batches([(names.ns(i), host_lines(names, i)) for i in range(1, n + 1)])
        if errors:
            raise RigError("network setup failed: " + "; ".join(errors))
        self.timings["net_s"] = time.monotonic() - t0

        t0 = time.monotonic()
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # sshd's privsep dir
        known, config, targets = [], [], []
        for i in range(1, n + 1):
            host = RigHost(f"h{i:02d}", names.ns(i), names.priv_ip(i), names.mgmt_ip(i))
            hdir = workdir / host.name
            conf = hdir / "sshd_config"
            conf.write_text(sshd_config([host.mgmt_ip, host.priv_ip], host_keys[i - 1], authorized))
            known.append(known_hosts_line([host.mgmt_ip, host.priv_ip, host.name], host_keys[i - 1]))
            config.append(ssh_config_block(host.name, host.mgmt_ip, self.key_path, self.known_hosts_path))
            log = hdir / "sshd.log"
            proc = launch(host.ns, host.name, conf, log)
            self._runtime[host.name] = _HostRuntime(proc, log)
            self.hosts.append(host)
            targets.append(ReadyTarget(host.name, [host.mgmt_ip, host.priv_ip], proc, log))
        self.known_hosts_path.write_text("".join(known))
        self.ssh_config_path.write_text("\n".join(config))
        wait_ready(targets, ready_timeout_s)
        kids_of = procs.children(rt.proc.pid for rt in self._runtime.values())
        for host in self.hosts:
            rt = self._runtime[host.name]
            kids = kids_of[rt.proc.pid]
            if len(kids) != 1 or procs.exe_path(kids[0]) != SSHD:
                raise RigError(f"{host.name}: expected one sshd under unshare, found {kids}")
            rt.sshd_pid, rt.pid_ns = kids[0], procs.ns_link(kids[0], "pid") or ""
        self.timings["sshd_s"] = time.monotonic() - t0

    # -- lookups -------------------------------------------------------------------------------

    def host(self, ref: HostRef) -> RigHost:
        """The RigHost for a host or its name ('h01')."""
        if isinstance(ref, RigHost):
            return ref
        for host in self.hosts:
            if host.name == ref:
                return host
        raise KeyError(f"no host {ref!r} in rig {self.ident}")

    def sshd_pid(self, ref: HostRef) -> int:
        """Root-namespace PID of the host's sshd (PID 1 inside the host)."""
        return self._runtime[self.host(ref).name].sshd_pid

    def sshd_log(self, ref: HostRef, lines: int = 30) -> str:
        """Last lines of the host's sshd log."""
        return log_tail(self._runtime[self.host(ref).name].log, lines)

    # -- acting inside a host -------------------------------------------------------------------

    def exec(
        self, ref: HostRef, argv: list[str], timeout_s: float = 10.0, *, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside the host (its netns, PID, mount and UTS namespaces); raises TimeoutExpired."""
        pid = self.sshd_pid(ref)
        if not procs.pid_alive(pid):
            raise RigError(f"{self.host(ref).name} is down (its sshd is gone)")
        full = ["nsenter", "--target", str(pid), "--pid", "--mount", "--uts", "--net", "--", *argv]
        proc = subprocess.Popen(
            full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd="/", env=env,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # nsenter forks into the PID namespace; kill the whole group, not just nsenter.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=5)
            raise
        return subprocess.CompletedProcess(full, proc.returncode, out, err)

    def _members(self, ref: HostRef) -> list[int]:
        """Root-namespace PIDs of live processes in the host's PID namespace."""
        rt = self._runtime[self.host(ref).name]
        return procs.pid_ns_members(rt.pid_ns) if rt.pid_ns else []

    def pids(self, ref: HostRef, *, root_ns: bool = False) -> list[int]:
        """Live processes of the host other than its sshd master, as PIDs seen inside the host
        (what `echo $!` over SSH prints), or root-namespace PIDs with root_ns=True."""
        sshd = self.sshd_pid(ref)
        members = [p for p in self._members(ref) if p != sshd]
        if root_ns:
            return sorted(members)
        local = (procs.ns_local_pid(p) for p in members)
        return sorted(p for p in local if p is not None)

    def kill_host_processes(self, ref: HostRef, except_sshd: bool = True) -> list[int]:
        """SIGKILL every process of the host; with except_sshd, sshd processes (master and sessions)
        survive so the host stays reachable. Returns the root-namespace PIDs that were targeted."""
        host = self.host(ref)
        rt = self._runtime[host.name]

        def targets() -> list[int]:
            found = set(self._members(host)) | set(procs.netns_pids(host.ns))
            found.discard(rt.proc.pid)  # the unshare parent; killing it takes the host down
            if except_sshd:
                found = {p for p in found if procs.exe_path(p) != SSHD}
            return sorted(found)

        first = targets()
        left = procs.kill_until_gone(targets, timeout_s=5.0)
        if not except_sshd:
            self._stop_hosts([host])
        if left:
            raise RigError(f"{host.name}: processes {left} survived SIGKILL")
        return first

    @property
    def controller_ip(self) -> str:
        """The management address of the `controller()` namespace."""
        return f"{self.root_mgmt_ip.rsplit('.', 1)[0]}.2"

    def controller(self) -> str:
        """A namespace for k3deploy itself on the management network only, like a login node that reaches
        the hosts over SSH but not their private IPs; made on first use, removed with the rig."""
        if self._controller is None:
            ns, veth, ip = f"{self._ident}ctl", f"{self._ident}cm", self.controller_ip
            errors = run_batches([(None, [
                f"netns add {ns}",
                f"link add {veth} type veth peer name {MGMT_IFACE} netns {ns}",
                f"link set dev {veth} addrgenmode none",
                f"link set dev {veth} master {self._names.bridge('m')} up",
            ])])  # fmt: skip
            if not errors:
                errors = run_batches([(ns, [
                    "link set dev lo up",
                    f"link set dev {MGMT_IFACE} addrgenmode none",
                    f"addr add {ip}/24 dev {MGMT_IFACE}",
                    f"link set dev {MGMT_IFACE} up",
                ])])  # fmt: skip
            if errors:
                raise RigError("controller namespace: " + "; ".join(errors))
            self._controller = ns
        return self._controller

    def iface_bytes(self, ref: HostRef, iface: str) -> tuple[int, int]:
        """(rx_bytes, tx_bytes) of an interface of the host."""
        return read_counters(self.host(ref).ns, iface)

    def set_link(self, ref: HostRef, iface: str, up: bool) -> None:
        """Bring one of the host's interfaces up or down (simulates a cable pull)."""
        host = self.host(ref)
        run = subprocess.run(
            ["ip", "-n", host.ns, "link", "set", "dev", iface, "up" if up else "down"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if run.returncode != 0:
            raise RigError(f"set_link {host.name} {iface}: {run.stderr.strip()}")

    def ssh_client(
        self, ref: HostRef, *, ip: str | None = None, timeout_s: float = 10.0
    ) -> paramiko.SSHClient:
        """A connected paramiko client (RejectPolicy, the rig's known_hosts) to the host's mgmt IP or `ip`."""
        import paramiko

        host = self.host(ref)
        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts_path))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            ip or host.mgmt_ip, username="root", key_filename=str(self.key_path), timeout=timeout_s,
            auth_timeout=timeout_s, banner_timeout=timeout_s, look_for_keys=False, allow_agent=False,
        )  # fmt: skip
        return client

    # -- teardown -------------------------------------------------------------------------------

    def _stop_hosts(self, hosts: list[RigHost]) -> None:
        """Kill each host's sshd (PID 1: the kernel kills the rest) and reap the unshare parents."""
        runtimes = [self._runtime[h.name] for h in hosts if h.name in self._runtime]
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

    def close(self) -> None:
        """Tear everything down; idempotent, safe after a partial setup."""
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        problems: list[str] = []
        try:
            self._stop_hosts(self.hosts)
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"stopping sshds: {exc}")
        if self._ident:
            problems += release(self._ident, self.workdir)
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)
        self.timings["down_s"] = time.monotonic() - t0
        if problems:
            raise RigError(f"rig {self._ident} teardown: " + "; ".join(problems))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
