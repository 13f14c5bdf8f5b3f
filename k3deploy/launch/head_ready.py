"""Rank 0's readiness, asked from here or as rank 0 itself sees it: its HTTP paths, then a real completion."""
from __future__ import annotations

from collections.abc import Callable

from k3deploy.errors import ExecError
from k3deploy.executors.base import Executor
from k3deploy.executors.http import NodeHttp, completes, serving
from k3deploy.nodeplan.jobs import NodeJob

# Readiness ends with a one-token completion (a real engine answers /health on deployments that serve nothing);
# this many server errors in a row from it, while every process runs, fail the start.
COMPLETION_TIMEOUT_S = 60.0
SERVER_ERRORS_FAIL = 3


class HeadReadiness:
    """One readiness client for rank 0 (a tunnel or on-node requests when `via` gives an executor)."""

    def __init__(self, head: NodeJob, via: Callable[[], Executor | None]) -> None:
        self.head = head
        self._via = via
        self._http: NodeHttp | None = None
        self._server_errors = 0  # consecutive 5xx answers to the readiness completion

    def client(self) -> NodeHttp:
        """The client, made on first use (opening a tunnel when rank 0 is asked through its executor)."""
        if self._http is None:
            self._http = NodeHttp(self.head.ready.url or "", via=self._via())
        return self._http

    def warm(self) -> None:
        """Make the client (and tunnel) ahead of time; a failure is reported by the next `serving`."""
        if self.head.ready.url:
            try:
                _ = self.client().route
            except ExecError:
                pass

    def serving(self) -> tuple[bool, str]:
        """Rank 0 answers every readiness path: (ok, why not)."""
        if self.head.ready.kind == "none" or not self.head.ready.url:
            return True, ""
        try:
            return serving(self.client(), self.head.ready.paths)
        except ExecError as exc:  # a forward that could not be opened: not serving as far as we can tell
            return False, str(exc)

    def check(self) -> tuple[bool, str, str | None]:
        """One round: rank 0 answers every readiness path, then (HTTP readiness) a one-token completion, on one
        client: (ok, why not, the cause to fail the group with when the completion keeps answering with a
        server error while every process still runs)."""
        if self.head.ready.kind == "none" or not self.head.ready.url:
            return True, "", None
        try:
            http = self.client()
            ok, why = serving(http, self.head.ready.paths)
            if not ok or self.head.ready.kind != "http":
                return ok, why, None
            ok, status, why = completes(http, COMPLETION_TIMEOUT_S)
        except ExecError as exc:  # a forward that could not be opened: not serving as far as we can tell
            return False, str(exc), None
        self._server_errors = self._server_errors + 1 if status >= 500 and status != 503 else 0
        fatal = (f"answers /health but cannot serve: {SERVER_ERRORS_FAIL} completions in a row failed ({why})"
                 if self._server_errors >= SERVER_ERRORS_FAIL else None)
        return ok, f"health answers, but not a completion yet: {why}" if not ok else "", fatal

    def close(self) -> None:
        """Close the client (and its tunnel)."""
        if self._http is not None:
            self._http.close()
            self._http = None
