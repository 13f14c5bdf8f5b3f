"""Does each node have its `iface`, up, holding its `ip`? (Moved here from launch's node check.)

A wrong interface makes Gloo fail at start-up; a wrong `ip` is worse: the rendezvous dials the wrong host and
the group hangs until the engine's distributed timeout (an hour by default). The node probe's facts find
both in milliseconds and name the node, what it has, and the field to fix.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

_ADDR_RE = re.compile(r"\binet6? ([0-9A-Fa-f:.]+)/(\d+)")
IFF_UP = 0x1


def missing(iface: str, present: Sequence[str]) -> str:
    """The node has no such interface."""
    return f"has no interface {iface} (it has: {', '.join(present) or 'none listed'})"


def is_up(flags_hex: str) -> bool | None:
    """IFF_UP from /sys/class/net/IFACE/flags (None when unreadable)."""
    try:
        return bool(int(flags_hex, 16) & IFF_UP)
    except ValueError:
        return None


def address_verdict(iface: str, ip: str, ip_addr_output: str | None) -> str | None:
    """Why `ip` is not usable on `iface` (from `ip -o addr show dev IFACE`), or None when it is or the
    node has no `ip` tool to tell."""
    if ip_addr_output is None:
        return None
    addrs = [ipaddress.ip_interface(f"{a}/{n}") for a, n in _ADDR_RE.findall(ip_addr_output)]
    want = ipaddress.ip_address(ip)
    if any(a.ip == want for a in addrs):
        return None
    if want.is_loopback and any(a.ip.is_loopback and want in a.network for a in addrs):
        return None  # 127.0.0.2 is this machine's on lo though only 127.0.0.1/8 is listed
    have = ", ".join(str(a.ip) for a in addrs) or "no address"
    return f"{ip} is not an address of {iface} on this node ({iface} has: {have})"
