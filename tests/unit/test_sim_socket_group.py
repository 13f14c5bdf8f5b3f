"""The stand-in's torch-free group (K3SIM_GROUP=tcp) keeps the Gloo group's contract: every rank joins and the
all_reduce checks it, barriers carry the worst status, a lost peer is noticed, and each failure reads as torch's
or Gloo's message for that event (what the engines log, and what k3deploy's failure catalog knows)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from k3deploy.sim.membership import node_group
from k3deploy.sim.rendezvous import NodeGroup, cause_of
from k3deploy.sim.serve_config import Rendezvous
from k3deploy.sim.socket_group import SocketGroup
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)


def groups(nnodes: int, timeout_s: float = 20.0, port: int | None = None) -> list[SocketGroup]:
    port = port or free_port()
    return [SocketGroup(Rendezvous("127.0.0.1", port, rank, nnodes, timeout_s)) for rank in range(nnodes)]


def run_all(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call in its own thread (one per rank); its result, or the exception it raised."""
    results: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - returned for the test to look at
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
        assert not t.is_alive(), "a rank never returned"
    return results


def close_all(gs: list[SocketGroup]) -> None:
    for g in gs:
        for peer in g._peers.values():
            peer.close()


def test_four_ranks_join_sum_and_meet_with_the_worst_status() -> None:
    gs = groups(4)
    try:
        assert run_all([g.join for g in gs]) == [10.0] * 4  # 1+2+3+4: every rank came
        assert run_all([lambda g=g, s=s: g.barrier(s, 10) for g, s in zip(gs, (0, 0, 3, 0))]) == [3] * 4
        assert run_all([lambda g=g: g.barrier(0, 10) for g in gs]) == [0] * 4
    finally:
        close_all(gs)


def test_one_node_needs_no_socket() -> None:
    (g,) = groups(1, port=0)
    assert g.join() == 1.0 and g.barrier(5, 1) == 5 and g._peers == {}


def test_a_missing_rank_fails_the_head_and_the_workers_as_torch_says() -> None:
    gs = groups(3, timeout_s=1.5)
    try:
        head, worker = run_all([gs[0].join, gs[1].join])  # rank 2 never comes
        assert cause_of(head) == "DistStoreError: Timed out after 2 seconds waiting for clients. 2/3 clients joined."
        # the worker gives up at the same deadline, or first hears the head's socket close
        assert isinstance(worker, RuntimeError)
        assert re.match(r"Timed out waiting \d+ms for recv|Connection closed by peer \[127\.0\.0\.1\]:", str(worker))
    finally:
        close_all(gs)


def test_a_worker_without_a_head_times_out_naming_where_it_tried() -> None:
    port = free_port()
    (worker,) = run_all([SocketGroup(Rendezvous("127.0.0.1", port, 1, 2, 1.0)).join])
    assert cause_of(worker) == (f"DistNetworkError: The client socket has timed out after 1s while trying to "
                                f"connect to (127.0.0.1, {port}).")


def test_a_dead_worker_is_lost_by_the_head_heartbeat_and_a_dead_head_by_the_worker() -> None:
    gs = groups(3)
    lost: list[tuple[str, int, str]] = []
    got = threading.Event()

    def on_lost(who: str) -> Callable[[int, str], None]:
        def call(rank: int, cause: str) -> None:
            lost.append((who, rank, cause))
            got.set()
        return call

    try:
        run_all([g.join for g in gs])
        gs[2]._peers[0].close()  # rank 2's process is gone
        gs[0].start_heartbeat(on_lost("head"), 30)
        gs[1].start_heartbeat(on_lost("worker1"), 30)
        assert got.wait(30)
        assert lost[0][:2] == ("head", 2) and lost[0][2].startswith("RuntimeError: Connection closed by peer [127.0.0.1]:")
        got.clear()
        gs[0]._peers[1].close()  # and now the head is gone too
        assert got.wait(40) and lost[-1][:2] == ("worker1", 0), lost
        assert lost[-1][2].startswith("RuntimeError: Connection closed by peer [127.0.0.1]:")
    finally:
        close_all(gs)


def test_an_interface_without_an_address_fails_as_gloo_does() -> None:
    rdv = Rendezvous("127.0.0.1", free_port(), 1, 2, 1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GLOO_SOCKET_IFNAME", "ens-bogus")
        (worker,) = run_all([SocketGroup(rdv).join])
    assert cause_of(worker) == "RuntimeError: ifa != nullptr. Unable to find address for: ens-bogus"


def test_the_group_is_chosen_by_k3sim_group() -> None:
    rdv = Rendezvous("127.0.0.1", 0, 0, 1, 1.0)
    assert type(node_group(rdv, {})) is NodeGroup and node_group(rdv, {}).label == "torch.distributed gloo"
    assert type(node_group(rdv, {"K3SIM_GROUP": "tcp"})) is SocketGroup
    with pytest.raises(ValueError, match=r"K3SIM_GROUP='nccl' is not a group the stand-in knows; use one of: gloo, tcp"):
        node_group(rdv, {"K3SIM_GROUP": "nccl"})
