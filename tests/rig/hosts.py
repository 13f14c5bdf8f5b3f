"""HostRig: N fake hosts (netns + PID namespace + sshd) on two bridged networks, for integration tests."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import Self

from . import procs
from .bringup import MAX_HOSTS, HostRef, HostRuntime, RigFiles, RigHost, start_hosts, stop_hosts
from .netns import MGMT_IFACE, NetNames, RigError, read_counters, run_batches
from .registry import allocate, cleanup_stale, release
from .sshd import SSHD, log_tail

if TYPE_CHECKING:
    import paramiko

__all__ = ["MAX_HOSTS", "HostRef", "HostRig", "RigHost"]


class HostRig:
    """Context manager building `n` hosts h01..hNN reachable over SSH from the root namespace."""

    def __init__(self, n: int = 4, *, prefix: str = "k3r", ready_timeout_s: float = 10.0) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}, got {n}")
        self.hosts: list[RigHost] = []
        self.timings: dict[str, float] = {}
        self._runtime: dict[str, HostRuntime] = {}
        self._closed = False
        self._controller: str | None = None
        self._ident = ""
        t0 = time.monotonic()
        cleanup_stale(prefix)
        ident, subnet, workdir = allocate(prefix, Path(tempfile.gettempdir()))
        self._ident, self.subnet, self.workdir = ident, subnet, workdir
        atexit.register(self.close)
        self._names = NetNames(ident, subnet)
        files = RigFiles(workdir)
        self.key_path, self.known_hosts_path, self.ssh_config_path = (files.key_path, files.known_hosts_path,
                                                                      files.ssh_config_path)
        self.root_priv_ip = self._names.root_ip("p")
        self.root_mgmt_ip = self._names.root_ip("m")
        try:
            start_hosts(self._names, files, n, ready_timeout_s, ident, hosts=self.hosts, runtime=self._runtime,
                        timings=self.timings)
        except BaseException:
            self.close()
            raise
        self.timings["up_s"] = time.monotonic() - t0

    @property
    def ident(self) -> str:
        """Unique name prefix of everything this rig creates (namespaces, links, files)."""
        return self._ident

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

    def priv_veth(self, ref: HostRef) -> str:
        """The root namespace's end of the host's private veth (on the private bridge)."""
        return self._names.veth("p", self.hosts.index(self.host(ref)) + 1)

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
        """Stop these hosts (their sshds and everything in their namespaces)."""
        stop_hosts([self._runtime[h.name] for h in hosts if h.name in self._runtime])

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
