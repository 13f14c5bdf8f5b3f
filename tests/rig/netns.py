"""Network namespaces, veths and bridges for the rig, built with `ip -batch`."""

from __future__ import annotations

import functools
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .procs import kill_until_gone, netns_pids

PRIV_IFACE = "ens-priv"
MGMT_IFACE = "ens-mgmt"
PRIV_NET = "10.231"
MGMT_NET = "10.232"


class RigError(RuntimeError):
    """The rig could not be built or torn down."""


@dataclass(frozen=True)
class NetNames:
    """Every name one rig owns; all start with `ident` so leftovers can be found by prefix."""

    ident: str
    subnet: int

    def ns(self, i: int) -> str:
        return f"{self.ident}h{i:02d}"

    def veth(self, net: str, i: int) -> str:
        return f"{self.ident}{net}{i:02d}"

    def bridge(self, net: str) -> str:
        return f"{self.ident}b{net}"

    def priv_ip(self, i: int) -> str:
        return f"{PRIV_NET}.{self.subnet}.{10 + i}"

    def mgmt_ip(self, i: int) -> str:
        return f"{MGMT_NET}.{self.subnet}.{10 + i}"

    def root_ip(self, net: str) -> str:
        return f"{PRIV_NET if net == 'p' else MGMT_NET}.{self.subnet}.1"


def root_lines(names: NetNames, n: int) -> list[str]:
    """Root-namespace batch: two bridges with the root's .1 address, then per host a netns and veths."""
    lines: list[str] = []
    for net in ("p", "m"):
        br = names.bridge(net)
        # addrgenmode none: no IPv6 link-local chatter, so byte counters move only with real traffic.
        lines += [
            f"link add {br} type bridge",
            f"link set dev {br} addrgenmode none",
            f"addr add {names.root_ip(net)}/24 dev {br}",
            f"link set dev {br} up",
        ]
    for i in range(1, n + 1):
        ns = names.ns(i)
        lines.append(f"netns add {ns}")
        for net, iface in (("p", PRIV_IFACE), ("m", MGMT_IFACE)):
            veth = names.veth(net, i)
            # Create the peer in the namespace with its final name: moving it later drops addresses.
            lines += [
                f"link add {veth} type veth peer name {iface} netns {ns}",
                f"link set dev {veth} addrgenmode none",
                f"link set dev {veth} master {names.bridge(net)} up",
            ]
    return lines


def host_lines(names: NetNames, i: int) -> list[str]:
    """Batch run inside one host namespace (`-n NS` is not accepted inside batch lines)."""
    lines = ["link set dev lo up"]
    for iface, ip in ((PRIV_IFACE, names.priv_ip(i)), (MGMT_IFACE, names.mgmt_ip(i))):
        lines += [
            f"link set dev {iface} addrgenmode none",
            f"addr add {ip}/24 dev {iface}",
            f"link set dev {iface} up",
        ]
    return lines


def run_batches(jobs: list[tuple[str | None, list[str]]], *, force: bool = False) -> list[str]:
    """Run `ip [-n NS] -batch -` jobs concurrently; returns the stderr of failed jobs."""
    procs = []
    for ns, lines in jobs:
        argv = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-batch", "-"]
        procs.append(
            subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    errors = []
    for (ns, lines), proc in zip(jobs, procs):
        _, err = proc.communicate("\n".join(lines) + "\n", timeout=30)
        if proc.returncode != 0:
            errors.append(f"ip -batch ({ns or 'root'}): {err.strip()}")
    return errors


def owned_netns(ident: str) -> list[str]:
    """Named network namespaces whose name starts with `ident`."""
    try:
        return sorted(name for name in os.listdir("/run/netns") if name.startswith(ident))
    except FileNotFoundError:
        return []


def owned_links(ident: str) -> list[str]:
    """Root-namespace interfaces whose name starts with `ident`."""
    return sorted(name for name in os.listdir("/sys/class/net") if name.startswith(ident))


def destroy(ident: str, timeout_s: float = 5.0) -> list[str]:
    """Kill every process in the rig's namespaces, then delete veths, bridges and namespaces."""
    problems = []
    for ns in owned_netns(ident):
        # `ip netns del` with live processes only removes the name; the namespace lives on.
        left = kill_until_gone(functools.partial(netns_pids, ns), timeout_s)
        if left:
            problems.append(f"{ns}: processes {left} survived SIGKILL")
    # Deleting the names lets the kernel free each namespace and its veth pairs in one batched,
    # asynchronous pass (0.1 s for 32 hosts); `link del` per veth costs ~40 ms each.
    names = owned_netns(ident)
    if names:
        run_batches([(None, [f"netns del {ns}" for ns in names])], force=True)
    deadline = time.monotonic() + timeout_s
    for _ in range(1000):
        veths = [name for name in owned_links(ident) if not name[len(ident) :].startswith("b")]
        if not veths or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    # Bridges, and any veth whose namespace is pinned by something outside the rig.
    links = owned_links(ident)
    if links:
        run_batches([(None, [f"link del {name}" for name in links])], force=True)
    left_over = owned_netns(ident) + owned_links(ident)
    if left_over:
        problems.append(f"left over after delete: {left_over}")
    return problems


def read_counters(ns: str, iface: str) -> tuple[int, int]:
    """(rx_bytes, tx_bytes) of an interface, read from sysfs inside the namespace."""
    base = Path("/sys/class/net") / iface / "statistics"
    run = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", str(base / "rx_bytes"), str(base / "tx_bytes")],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if run.returncode != 0:
        raise RigError(f"cannot read counters of {iface} in {ns}: {run.stderr.strip()}")
    rx, tx = run.stdout.split()
    return int(rx), int(tx)
