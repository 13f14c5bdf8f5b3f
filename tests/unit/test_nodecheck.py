"""The interface verdicts (moved from launch's node check into preflight): the interface exists, is up and
holds the node's `ip`."""
from __future__ import annotations

import pytest

from k3deploy.preflight.interfaces import address_verdict, is_up, missing

IP_OUT = ("2: ens-priv    inet 10.0.0.11/24 brd 10.0.0.255 scope global ens-priv\\       valid_lft forever\n"
          "2: ens-priv    inet6 fd00::11/64 scope global \\       valid_lft forever\n")


@pytest.mark.parametrize(("iface", "ip", "output", "says"), [
    ("ens-priv", "10.0.0.11", IP_OUT, None),
    ("ens-priv", "fd00::11", IP_OUT, None),
    ("ens-priv", "10.0.0.12", IP_OUT,
     "10.0.0.12 is not an address of ens-priv on this node (ens-priv has: 10.0.0.11, fd00::11)"),
    ("lo", "127.0.0.3", "1: lo    inet 127.0.0.1/8 scope host lo\n", None),
    ("lo", "10.0.0.11", "1: lo    inet 127.0.0.1/8 scope host lo\n", "is not an address of lo"),
    ("ens-priv", "10.0.0.11", None, None),  # no `ip` tool on the node: cannot tell
    ("ens-priv", "10.0.0.11", "", "(ens-priv has: no address)"),
])
def test_address_verdict(iface: str, ip: str, output: str | None, says: str | None) -> None:
    got = address_verdict(iface, ip, output)
    assert (got is None) if says is None else (got is not None and says in got), got


def test_missing_and_flags() -> None:
    assert missing("ens-bogus", ["ens-priv", "lo"]) == "has no interface ens-bogus (it has: ens-priv, lo)"
    assert is_up("0x1003") is True and is_up("0x1002") is False and is_up("") is None
