"""One OpenSSH server per fake host: keys, config, launch as PID 1 of a PID namespace, readiness."""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .netns import RigError

SSHD = "/usr/sbin/sshd"
SSH_PORT = 22


def keygen(paths: list[Path], comment: str) -> None:
    """Create throwaway ed25519 key pairs, all ssh-keygen processes at once."""
    procs = [
        subprocess.Popen(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(p)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p in paths
    ]
    for path, proc in zip(paths, procs):
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise RigError(f"ssh-keygen {path}: {out.strip()}")


def public_key(path: Path) -> str:
    """'ssh-ed25519 AAAA...' from a .pub file, without the comment."""
    kind, blob = Path(f"{path}.pub").read_text().split()[:2]
    return f"{kind} {blob}"


@functools.cache
def sshd_version() -> tuple[int, int]:
    run = subprocess.run([SSHD, "-V"], capture_output=True, text=True, timeout=10, check=False)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", run.stdout + run.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def sshd_config(ips: list[str], host_key: Path, authorized_keys: Path) -> str:
    """sshd_config for one host: key-only root login, quiet, tolerant of connection bursts."""
    lines = [f"ListenAddress {ip}:{SSH_PORT}" for ip in ips] + [
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PidFile none",  # the default /run/sshd.pid would be shared by every host
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "MaxStartups 100:30:200",
        # SHLVL stops root's ~/.bashrc from running pyenv init on every command (200 ms -> 118 ms); stand-ins
        # join their group without torch unless the topology asks for Gloo (tests/conftest.py says why).
        f"SetEnv SHLVL=1 K3SIM_GROUP={os.environ.get('K3SIM_GROUP', 'tcp')}",
        "AcceptEnv LANG LC_*",
        "PrintMotd no",
        "Subsystem sftp internal-sftp",
    ]
    if sshd_version() >= (9, 8):
        # Newer sshd throttles a source address after failed handshakes (tests refuse keys on purpose).
        lines.append("PerSourcePenalties no")
    return "\n".join(lines) + "\n"


def known_hosts_line(names: list[str], host_key: Path) -> str:
    return f"{','.join(names)} {public_key(host_key)}\n"


def ssh_config_block(alias: str, ip: str, key: Path, known_hosts: Path) -> str:
    return (
        f"Host {alias}\n"
        f"    HostName {ip}\n"
        "    User root\n"
        f"    IdentityFile {key}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        "    StrictHostKeyChecking yes\n"
    )


def launch(ns: str, hostname: str, conf: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start sshd as PID 1 of a new PID+UTS+mount namespace inside netns `ns`."""
    shell = f"hostname {hostname} && exec {SSHD} -D -f {conf} -E {log}"
    argv = ["ip", "netns", "exec", ns]
    argv += ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", shell]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, cwd="/"
        )


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


@dataclass
class ReadyTarget:
    """One sshd to wait for: its launcher and the addresses it must accept on."""

    name: str
    ips: list[str]
    proc: subprocess.Popen[bytes]
    log: Path


def _accepts(ip: str, timeout_s: float) -> bool:
    try:
        with socket.create_connection((ip, SSH_PORT), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_ready(targets: list[ReadyTarget], timeout_s: float) -> None:
    """Wait until every sshd accepts TCP on every address; raise with the log tail otherwise."""
    deadline = time.monotonic() + timeout_s
    pending = [(t, ip) for t in targets for ip in t.ips]
    for _ in range(10_000):
        for target, _ip in pending:
            if target.proc.poll() is not None:
                raise RigError(
                    f"sshd of {target.name} exited with {target.proc.returncode}:\n{log_tail(target.log)}"
                )
        pending = [(t, ip) for t, ip in pending if not _accepts(ip, 0.2)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if pending:
        target, ip = pending[0]
        raise RigError(
            f"sshd of {target.name} not accepting on {ip}:{SSH_PORT} after {timeout_s} s "
            f"({len(pending)} address(es) pending):\n{log_tail(target.log)}"
        )
