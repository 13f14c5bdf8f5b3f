"""Log lines in the engine's format: SGLang `[time DPx PPx TPx EPx]`, vLLM `INFO mm-dd hh:mm:ss [file:n]`."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Literal, TextIO

from k3deploy.sim.engine_args import Mimic

Level = Literal["INFO", "WARNING", "ERROR"]
Source = Literal["server", "rank"]


@dataclass(frozen=True)
class Ranks:
    """Ranks of the node's first GPU, which the stand-in speaks for."""

    dp: int
    pp: int
    tp: int
    ep: int
    world_rank: int
    world_size: int


def first_gpu_ranks(
    node_rank: int, gpus_per_node: int, *, tp: int, pp: int, ep: int, dp: int, attention_dp: bool, nnodes: int
) -> Ranks:
    """Ranks of GPU 0 of a node when GPUs are numbered node by node, TP fastest."""
    world_rank = node_rank * gpus_per_node
    tp_rank = world_rank % tp
    pp_rank = (world_rank // tp) % pp
    ep_rank = tp_rank // max(tp // max(ep, 1), 1)
    dp_rank = tp_rank // max(tp // dp, 1) if attention_dp else (world_rank // (tp * pp)) % max(dp, 1)
    return Ranks(
        dp=dp_rank,
        pp=pp_rank,
        tp=tp_rank,
        ep=ep_rank,
        world_rank=world_rank,
        world_size=gpus_per_node * nnodes,
    )


class EngineLog:
    """Writes one engine's lines, flushed per line (supervisors and tests read the log while it grows)."""

    def __init__(self, mimic: Mimic, ranks: Ranks, stream: TextIO | None = None) -> None:
        self.mimic = mimic
        self.ranks = ranks
        # vLLM logs to stdout, SGLang through logging's default handler on stderr.
        self.stream = stream if stream is not None else (sys.stdout if mimic == "vllm" else sys.stderr)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _prefix(self, source: Source, level: Level, where: str) -> str:
        now = time.time()
        if self.mimic == "sglang":
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            if source == "server":
                return f"[{stamp}] "
            r = self.ranks
            return f"[{stamp} DP{r.dp} PP{r.pp} TP{r.tp} EP{r.ep}] "
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
        proc = "APIServer" if source == "server" else f"EngineCore_DP{self.ranks.dp}"
        return f"({proc} pid={self._pid}) {level} {stamp} [{where}] "

    def line(
        self, message: str, *, source: Source = "rank", level: Level = "INFO", where: str = "core.py:100"
    ) -> None:
        """Write one message (each physical line gets the prefix)."""
        prefix = self._prefix(source, level, where)
        text = "".join(f"{prefix}{part}\n" for part in message.split("\n"))
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def info(self, message: str, *, source: Source = "rank", where: str = "core.py:100") -> None:
        """An INFO line."""
        self.line(message, source=source, level="INFO", where=where)

    def warning(self, message: str, *, source: Source = "rank", where: str = "core.py:100") -> None:
        """A WARNING line."""
        self.line(message, source=source, level="WARNING", where=where)

    def error(self, message: str, *, source: Source = "rank", where: str = "core.py:100") -> None:
        """An ERROR line."""
        self.line(message, source=source, level="ERROR", where=where)

    def raw(self, text: str) -> None:
        """Unprefixed output, e.g. a traceback or uvicorn's access log."""
        with self._lock:
            self.stream.write(text if text.endswith("\n") else text + "\n")
            self.stream.flush()
