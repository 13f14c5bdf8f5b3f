"""A vLLM head whose worker node is gone, as vLLM 0.32.0 behaves (measured by
tests/realengine/test_health_peer_gone.py): nothing notices without traffic, so /health stays 200; the next
request's collective fails, the engine core dies, the request gets 500, and the API server then shuts down
and exits 0 (vllm/entrypoints/launchers/launcher.py terminate_if_errored), unless
VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it up answering /health 503 (serve/instrumentator/health.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from k3deploy.sim.log_format import EngineLog

KEEP_ALIVE_ENV = "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"
# The real API server's 500 reaches the client before uvicorn stops: the stand-in leaves as long for it.
EXIT_AFTER_S = 0.5
DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


@dataclass(frozen=True)
class LostPeer:
    """Which node went, and what Gloo said when the head's heartbeat lost it."""

    rank: int
    cause: str


def keep_alive(env: Mapping[str, str]) -> bool:
    """vLLM's envs.py reads the variable as an integer flag."""
    try:
        return bool(int(env.get(KEEP_ALIVE_ENV, "0") or "0"))
    except ValueError:
        return False


def engine_death(log: EngineLog, lost: LostPeer) -> None:
    """The lines real vLLM's head logged when its first request after the loss failed (engine core, then the
    API server; their tracebacks left out), with the Gloo error the heartbeat got."""
    gloo = lost.cause.split(": ", 1)[-1]  # cause_of's `Type: message`; vLLM quotes the message alone
    log.error(f"RuntimeError: Worker failed with error '{gloo}', please check the stack trace above for the root "
              "cause", where="core.py:1512")
    log.error("AsyncLLM output_handler failed.", source="server", where="async_llm.py:906")
    log.error(f"vllm.v1.engine.exceptions.EngineDeadError: {DEAD_MESSAGE}", source="server",
              where="async_llm.py:906")


def shut_down_after_reply(log: EngineLog, exit_now: Callable[[int], object]) -> None:
    """Exit 0 once the failed request's reply has gone out, as uvicorn does after should_exit."""

    def leave() -> None:
        log.warning("[shutdown] Process manager: force killing remaining processes count=1", source="server",
                    where="utils.py:648")
        exit_now(0)

    timer = threading.Timer(EXIT_AFTER_S, leave)
    timer.daemon = True
    timer.start()
