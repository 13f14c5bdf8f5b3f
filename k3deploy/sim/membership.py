"""This node's place in the Gloo group as the engine logs it: joining, the post-load barrier, liveness."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

from k3deploy.sim import startup_lines as lines
from k3deploy.sim.faults import HANG_DEFAULT_S, Faults
from k3deploy.sim.log_format import EngineLog
from k3deploy.sim.rendezvous import NodeGroup, cause_of, watchdog
from k3deploy.sim.serve_config import Rendezvous, ServeConfig
from k3deploy.sim.socket_group import SocketGroup

FAILED = 1
# Which group the node joins: torch.distributed over Gloo (the default, as the engines), or plain TCP without
# torch (socket_group.py says when that is the right choice).
GROUP_ENV = "K3SIM_GROUP"
GROUPS: dict[str, type[NodeGroup]] = {"gloo": NodeGroup, "tcp": SocketGroup}
# A moment past the timeout lets the library's own error, when it comes on time, be the logged cause.
WATCHDOG_GRACE_S = 0.25


def exit_now(code: int) -> NoReturn:
    """Flush and leave at once: once Gloo is up, interpreter shutdown can block in its destructor."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def node_group(rdv: Rendezvous, env: Mapping[str, str]) -> NodeGroup:
    """The group K3SIM_GROUP names (gloo when unset); a ValueError naming the variable for any other value."""
    kind = env.get(GROUP_ENV) or "gloo"
    if kind not in GROUPS:
        raise ValueError(f"{GROUP_ENV}={kind!r} is not a group the stand-in knows; use one of: {', '.join(GROUPS)}")
    return GROUPS[kind](rdv)


class Membership:
    """Join, meet after loading, and watch the other nodes; every failure is a clear line and exit 1."""

    def __init__(self, cfg: ServeConfig, log: EngineLog, faults: Faults) -> None:
        self.cfg, self.log, self.faults = cfg, log, faults
        self.group = node_group(cfg.rendezvous, os.environ)

    def crash(self, exception_line: str) -> NoReturn:
        """The engine's crash report, then exit 1."""
        self.log.error(lines.failure_block(self.cfg, exception_line), where="core.py:735")
        exit_now(FAILED)

    def join(self) -> None:
        """Rendezvous within the configured timeout (a hard wall-clock bound) and check an all_reduce."""
        cfg, log, rdv = self.cfg, self.log, self.cfg.rendezvous
        self.group.load()  # torch's import is start-up cost, not rendezvous time
        if cfg.mimic == "sglang":
            log.info("Init parallel begin.", where="model_runner.py:640")
        else:
            world_line = lines.vllm_rank_lines(cfg, log.ranks, self.group.init_method)[0]
            log.info(world_line, where="parallel_state.py:1165")
        started = time.monotonic()
        if "hang_at_rendezvous" in self.faults:
            self._hang()
        where = self.group.describe()

        why = "not every node joined" if cfg.head else "the head is unreachable or not every node joined"

        def expired() -> None:
            log.error(
                f"Rendezvous failed: {where} did not complete within {rdv.timeout_s:.0f} s "
                f"(the configured timeout): {why}"
            )

        try:
            with watchdog(rdv.timeout_s + WATCHDOG_GRACE_S, expired):
                total = self.group.join()
        except Exception as exc:  # noqa: BLE001 - every torch/Gloo failure is reported the same way
            cause = cause_of(exc)
            if "timed out" in cause.lower() or "timeout" in cause.lower():
                log.error(
                    f"Rendezvous failed: {where} did not complete within {rdv.timeout_s:.0f} s (the "
                    f"configured timeout): {cause}"
                )
            else:
                log.error(f"Rendezvous failed: {where}: {cause}")
            exit_now(FAILED)
        expected = rdv.nnodes * (rdv.nnodes + 1) / 2
        if total != expected:
            self.crash(f"RuntimeError: all_reduce check failed: got {total:g}, expected {expected:g}")
        log.info(
            f"k3sim: {self.group.label} group up at {self.group.init_method}: world_size={rdv.nnodes} "
            f"(one rank per node), node_rank={rdv.node_rank}, all_reduce sum={total:g} as expected"
        )
        if cfg.mimic == "sglang":
            log.info(
                f"Init parallel ends. elapsed={time.monotonic() - started:.2f} s", where="model_runner.py:700"
            )
        else:
            assigned = lines.vllm_rank_lines(cfg, log.ranks, self.group.init_method)[1]
            log.info(assigned, where="parallel_state.py:1420")

    def _hang(self) -> NoReturn:
        hang_s = self.faults.seconds("hang_at_rendezvous", HANG_DEFAULT_S)
        rank = self.cfg.rendezvous.node_rank
        self.log.warning(
            f"k3sim fault hang_at_rendezvous: node rank {rank} never joins (sleeping {hang_s:.0f} s)"
        )
        time.sleep(hang_s)
        self.crash(f"RuntimeError: k3sim fault hang_at_rendezvous: gave up after {hang_s:.0f} s")

    def wait_all_loaded(self) -> None:
        """Meet every node after loading; a slow node past the timeout, or a dead one, fails start-up."""
        rdv = self.cfg.rendezvous
        if rdv.nnodes == 1:
            return

        def expired() -> None:
            if self.cfg.mimic == "vllm":
                self.log.error(
                    "TimeoutError: Timed out waiting for engine core processes to start. This is often "
                    f"caused by slow weight loading for large models. Waited {rdv.timeout_s:.0f} seconds "
                    "(configured by VLLM_ENGINE_READY_TIMEOUT_S).",
                    source="server",
                )
            else:
                self.log.error(
                    f"Scheduler hit an exception: timed out after {rdv.timeout_s:.0f} s "
                    f"(--dist-timeout) waiting for all {rdv.nnodes} nodes to finish loading"
                )

        try:
            with watchdog(rdv.timeout_s + WATCHDOG_GRACE_S, expired):
                self.group.barrier(0, rdv.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a node died while the others loaded
            self.crash(f"RuntimeError: lost a node while loading ({self.group.describe()}): {cause_of(exc)}")

    def watch(self, on_lost_worker: Callable[[int, str], None], lifetime_s: float) -> None:
        """Heartbeat the other nodes: a worker exits when the head is gone; the head calls on_lost_worker."""
        if self.cfg.rendezvous.nnodes == 1:
            return

        def on_lost(rank: int, cause: str) -> None:
            if self.cfg.head:
                on_lost_worker(rank, cause)
                return
            if "outlive_head" in self.faults:  # no line, no exit: only a supervisor stops this node
                return
            self.log.error(f"Lost the head node ({self.group.init_method}): {cause}. Exiting.")
            exit_now(FAILED)

        self.group.start_heartbeat(on_lost, lifetime_s)
