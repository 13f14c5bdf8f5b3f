"""The pre-start node check: the interface exists and the node's `ip` is one of its addresses."""
from __future__ import annotations

import os
import subprocess

import pytest

from k3deploy.launch.nodecheck import check_script, verdict

IP_OUT = ("2: ens-priv    inet 10.0.0.11/24 brd 10.0.0.255 scope global ens-priv\\       valid_lft forever\n"
          "2: ens-priv    inet6 fd00::11/64 scope global \\       valid_lft forever\n")


@pytest.mark.parametrize(("iface", "ip", "output", "says"), [
    ("ens-priv", "10.0.0.11", "present\n" + IP_OUT, None),
    ("ens-priv", "fd00::11", "present\n" + IP_OUT, None),
    ("ens-priv", "10.0.0.12", "present\n" + IP_OUT,
     "10.0.0.12 is not an address of ens-priv on this node (ens-priv has: 10.0.0.11, fd00::11)"),
    ("ens-bogus", "10.0.0.11", "missing\nens-priv\nlo\n", "has no interface ens-bogus (it has: ens-priv, lo)"),
    ("lo", "127.0.0.3", "present\n1: lo    inet 127.0.0.1/8 scope host lo\n", None),
    ("lo", "10.0.0.11", "present\n1: lo    inet 127.0.0.1/8 scope host lo\n", "is not an address of lo"),
    ("ens-priv", "10.0.0.11", "present\nno-ip-tool\n", None),  # cannot tell: the engine's errors still apply
    ("ens-priv", "10.0.0.11", "present\n", "(ens-priv has: no address)"),
])
def test_verdict(iface: str, ip: str, output: str, says: str | None) -> None:
    got = verdict(iface, ip, output)
    assert (got is None) if says is None else (got is not None and says in got), got


def test_the_script_on_this_machine() -> None:
    def run(iface: str) -> str:
        return subprocess.run(["/bin/sh", "-c", check_script(iface)], capture_output=True, text=True, timeout=30,
                              check=True).stdout

    assert verdict("lo", "127.0.0.1", run("lo")) is None
    assert verdict("lo", "127.0.0.4", run("lo")) is None
    missing = verdict("no-such-if0", "127.0.0.1", run("no-such-if0"))
    assert missing is not None and "has no interface no-such-if0" in missing and "lo" in missing
    hostile = run("x;touch /tmp/k3-nodecheck-pwned")
    assert hostile.startswith("missing") and not os.path.exists("/tmp/k3-nodecheck-pwned")
