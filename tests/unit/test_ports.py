"""tests/ports.py: the blocks handed out are free, apart, and never handed to two live processes at once."""
from __future__ import annotations

import itertools
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ports


@pytest.mark.timeout(60)
def test_blocks_are_free_outside_the_ephemeral_range_and_never_shared_with_another_process() -> None:
    mine = ports.free_ports(40)
    child = subprocess.run([sys.executable, "-c", "from tests import ports; print(*ports.free_ports(40))"],
                           capture_output=True, text=True, timeout=50, check=True)
    theirs = [int(p) for p in child.stdout.split()]
    assert len(set(mine)) == len(set(theirs)) == 40
    blocks = sorted(mine + theirs)
    assert all(b - a >= ports.STRIDE for a, b in itertools.pairwise(blocks)), "two blocks overlap"
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert all(ports.FIRST <= p and p + ports.STRIDE <= min(ports.LAST, low) for p in blocks)
    with socket.socket() as s:  # a block handed out is bindable (nothing listens on it)
        s.bind(("0.0.0.0", mine[0] + ports.STRIDE - 1))


@pytest.mark.timeout(60)
def test_a_block_with_a_listener_in_it_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        block = next(k for k in range(7, ports._BLOCKS) if ports._all_free(ports.FIRST + k * ports.STRIDE))
        start = ports.FIRST + block * ports.STRIDE
        squatter.bind(("127.0.0.1", start + 3))
        squatter.listen()
        monkeypatch.setattr(ports, "_cursor", block - 1)  # the next block handed out would be this one
        given = ports.free_port()
    assert given != start and not (given <= start + 3 < given + ports.STRIDE)


@pytest.mark.timeout(60)
def test_no_topology_or_asset_names_a_port_in_the_allocators_range() -> None:
    """A fixed port in a topology the tests load beside allocated ones must not be one the allocator hands out."""
    root = Path(__file__).resolve().parents[2]
    named = {(str(f.relative_to(root)), int(n)) for f in [*root.glob("topologies/*.yaml"), *root.glob("tests/assets/**/*.yaml")]
             for n in re.findall(r"port:\s*(\d+)", f.read_text(encoding="utf-8"))}
    assert len(named) > 10
    assert [(f, n) for f, n in named if ports.FIRST <= n < ports.LAST] == []
