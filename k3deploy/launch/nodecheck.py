"""Before anything starts: does each node have its `iface`, and is its `ip` an address on it?

A wrong interface makes Gloo fail at start-up; a wrong `ip` is worse: the rendezvous dials the wrong host and
the group hangs until the engine's distributed timeout (an hour by default). One command round per node
finds both in milliseconds and names the node, what it has, and the field to fix.
"""
from __future__ import annotations

import ipaddress
import re
import shlex

from k3deploy.executors.base import sh

NO_IP_TOOL = "no-ip-tool"
_ADDR_RE = re.compile(r"\binet6? ([0-9A-Fa-f:.]+)/(\d+)")


def check_script(iface: str) -> str:
    """List the interface's addresses on the node (`ip -o addr`), or say it is missing and list what exists."""
    i = shlex.quote(iface)
    return sh(
        f"if [ ! -e /sys/class/net/{i} ]; then echo missing; ls /sys/class/net 2>/dev/null; exit 0; fi\n"
        "echo present\n"
        "for t in ip /sbin/ip /usr/sbin/ip /bin/ip; do\n"
        f"  if command -v $t >/dev/null 2>&1; then exec $t -o addr show dev {i}; fi\n"
        "done\n"
        f"echo {NO_IP_TOOL}\n"
    )


def verdict(iface: str, ip: str, output: str) -> str | None:
    """Why the node cannot carry the collectives as configured, or None when it can (or cannot tell)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return None  # nothing to judge by: the engine's own errors still name the node
    if lines[0] == "missing":
        present = ", ".join(lines[1:]) or "none listed"
        return f"has no interface {iface} (it has: {present}); fix nodes[].iface"
    if NO_IP_TOOL in lines:
        return None
    addrs = [ipaddress.ip_interface(f"{a}/{n}") for a, n in _ADDR_RE.findall(output)]
    want = ipaddress.ip_address(ip)
    if any(a.ip == want for a in addrs):
        return None
    if want.is_loopback and any(a.ip.is_loopback and want in a.network for a in addrs):
        return None  # 127.0.0.2 is this machine's on lo though only 127.0.0.1/8 is listed
    have = ", ".join(str(a.ip) for a in addrs) or "no address"
    return f"{ip} is not an address of {iface} on this node ({iface} has: {have}); fix nodes[].ip or nodes[].iface"
