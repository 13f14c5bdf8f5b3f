"""Watch a head's HTTP surface after its peer node is gone: /health alone for a while (no traffic), then
/health and a one-token completion every second, each answer recorded with its time since the loss."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

STEP_S = 1.0
HEALTH_TIMEOUT_S = 5.0
COMPLETION_TIMEOUT_S = 15.0  # a completion still unanswered then is recorded as "hang"
GONE_SAMPLES = 3  # the head exited and this many "refused" answers in a row from both: stop watching


@dataclass(frozen=True)
class Sample:
    """One poll: seconds since the peer was killed, what /health said, what the completion said (None: not
    sent in the idle phase)."""

    t_s: float
    health: str
    completion: str | None


@dataclass
class Watch:
    """Every sample, and when the head's process exited (None: still running at the end)."""

    samples: list[Sample] = field(default_factory=list)
    head_exit_s: float | None = None
    head_status: int | None = None
    failure_body: str | None = None  # the first completion answered with an error: its body

    def first(self, predicate: Callable[[Sample], bool]) -> Sample | None:
        """The earliest sample matching."""
        return next((s for s in self.samples if predicate(s)), None)

    def phases(self) -> list[tuple[str, str | None, float]]:
        """Runs of equal (health, completion) answers: each run's answers and the time it began."""
        out: list[tuple[str, str | None, float]] = []
        for s in self.samples:
            if not out or out[-1][:2] != (s.health, s.completion):
                out.append((s.health, s.completion, s.t_s))
        return out

    def summary(self) -> str:
        """The phases, one line, for the test's output and assertion messages."""
        runs = ", ".join(f"t={t:.1f}s /health {h}" + (f" completion {c}" if c else "") for h, c, t in self.phases())
        end = "running at the end" if self.head_exit_s is None else \
            f"exited {self.head_status} at t={self.head_exit_s:.1f}s"
        return f"{runs}; head {end}"


def answer(call: Callable[[], httpx.Response], bodies: list[str] | None = None) -> str:
    """The status code, or what kept it from coming: hang (timed out), refused (nobody listens), dropped
    (the connection closed without a reply). An error's body goes to `bodies`."""
    try:
        reply = call()
        if reply.status_code >= 400 and bodies is not None:
            bodies.append(reply.text)
        return str(reply.status_code)
    except httpx.TimeoutException:
        return "hang"
    except httpx.ConnectError:
        return "refused"
    except httpx.TransportError:
        return "dropped"


def watch(url: str, model: str, killed_at: float, exited: Callable[[], int | None], idle_s: float,
          window_s: float) -> Watch:
    """Poll until window_s after killed_at (or the head is gone): /health only for the first idle_s."""
    body = {"model": model, "prompt": "still there?", "max_tokens": 1, "temperature": 0}
    out, bodies = Watch(), list[str]()
    while (now := time.monotonic() - killed_at) < window_s:
        health = answer(lambda: httpx.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S))
        completion = None
        if now >= idle_s:
            completion = answer(lambda: httpx.post(f"{url}/v1/completions", json=body,
                                                   timeout=COMPLETION_TIMEOUT_S), bodies)
            out.failure_body = out.failure_body or (bodies[0] if bodies else None)
        out.samples.append(Sample(round(now, 1), health, completion))
        status = exited()
        if status is not None and out.head_exit_s is None:
            out.head_exit_s, out.head_status = time.monotonic() - killed_at, status
        last = out.samples[-GONE_SAMPLES:]
        if out.head_exit_s is not None and len(last) == GONE_SAMPLES and \
                all(s.health == s.completion == "refused" for s in last):
            break
        time.sleep(max(0.0, STEP_S - (time.monotonic() - killed_at - now)))
    return out
