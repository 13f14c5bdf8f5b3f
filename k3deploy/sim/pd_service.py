"""The OpenAI API of an SGLang prefill or decode server (--disaggregation-mode): requests from a PD router
carry bootstrap fields; the prefill computes the prompt and publishes its state for the room, the decode
receives that state from the prefill's bootstrap server and generates from it."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from types import MappingProxyType
from typing import Any

from k3deploy.sim.chat_service import ApiError, ChatService, Reply
from k3deploy.sim.disaggregation import (
    BOOTSTRAP_TIMEOUT_ENV,
    WAITING_TIMEOUT_ENV,
    Bootstrap,
    BootstrapServer,
    TransferError,
    bootstrap_of,
    fetch_state,
    received_facts,
    timeout_s,
)
from k3deploy.sim.recall import Facts, read_facts
from k3deploy.sim.tokens import message_text, render_prompt, token_ids

_BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def _plain(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in _BOOTSTRAP_KEYS}


class PdChatService(ChatService):
    """ChatService for one role of a disaggregated pair; requests without bootstrap fields run as usual."""

    bootstrap: BootstrapServer | None = None  # the prefill's; set once it listens
    timeouts_s: Mapping[str, float] = MappingProxyType({})

    def start_role(self, env: Mapping[str, str]) -> bool:
        """A prefill's bootstrap server on --disaggregation-bootstrap-port; a decode's cache line (False:
        the port is taken, logged)."""
        cfg, log = self.cfg, self.log
        self.timeouts_s = {name: timeout_s(env, name) for name in (BOOTSTRAP_TIMEOUT_ENV, WAITING_TIMEOUT_ENV)}
        if cfg.pd_mode == "decode":
            line = ("EXPERIMENTAL: Radix cache is enabled for decode server" if cfg.prefix_cache
                    else "KV cache is forced as chunk cache for decode server")
            log.warning(line, source="server", where="server_args.py:2326")
            return True
        info = {"prefill_attn_tp_size": cfg.tp, "prefill_dp_size": cfg.dp, "prefill_pp_size": cfg.pp,
                "prefill_page_size": 1}
        try:
            self.bootstrap = BootstrapServer(cfg.bind_host, cfg.bootstrap_port, info, self.faults,
                                             self.timeouts_s[WAITING_TIMEOUT_ENV])
        except OSError as exc:
            log.error(f"OSError: [Errno {exc.errno}] {exc.strerror}: bootstrap server on "
                      f"('{cfg.bind_host}', {cfg.bootstrap_port})", source="server")
            return False
        self.bootstrap.start()
        return True

    def chat(self, body: Any) -> Reply:
        """A PD request: the prefill's part or the decode's part; any other request as a plain server."""
        boot = bootstrap_of(body, self.cfg.bootstrap_port)
        if boot is None or self.cfg.pd_mode != "prefill":
            return super().chat(body)
        return self._prefill(body, boot)

    def completion(self, body: Any) -> Reply:
        """A PD /v1/completions request (the router sends it to both roles, as it does a chat)."""
        boot = bootstrap_of(body, self.cfg.bootstrap_port)
        if boot is None or self.cfg.pd_mode != "prefill":
            return super().completion(body)
        reply = super().completion({**_plain(body), "stream": False, "max_tokens": 1})
        prompt = body["prompt"][0] if isinstance(body["prompt"], list) else body["prompt"]
        self._publish(boot, token_ids(prompt), read_facts(prompt, ""), reply)
        if body.get("stream") and reply.body is not None:
            return Reply(chunks=_as_chunks(reply.body, text=True))
        return reply

    def _prefill(self, body: dict[str, Any], boot: Bootstrap) -> Reply:
        # The prefill server computes the prompt and one token; the decode server generates the rest.
        reply = super().chat({**_plain(body), "stream": False, "max_tokens": 1, "max_completion_tokens": None})
        messages = body["messages"]
        prompt = render_prompt(messages, body.get("tools") if body.get("tool_choice") != "none" else None)
        asked = message_text(messages[-1].get("content")) if messages[-1].get("role") == "user" else ""
        self._publish(boot, prompt.ids, read_facts(prompt.text, asked), reply)
        if body.get("stream") and reply.body is not None:
            return Reply(chunks=_as_chunks(reply.body))
        return reply

    def _publish(self, boot: Bootstrap, ids: list[int], facts: Facts, reply: Reply) -> None:
        """The room's state for the decode, then wait until the decode fetched it (ApiError at the timeout)."""
        assert self.bootstrap is not None
        rooms = self.bootstrap.rooms
        rooms.publish(str(boot.room), ids, facts)
        wait_s = self.timeouts_s.get(BOOTSTRAP_TIMEOUT_ENV, 300.0)
        if not rooms.wait_fetched(str(boot.room), wait_s):
            err = TransferError(boot.room, f"Request timed out after {wait_s:.0f}s in KVPoll.Bootstrapping")
            self.log.error(
                f"Prefill bootstrap failed for request rank=0 req.rid='{reply.body and reply.body['id']}' "
                f"req.bootstrap_room={boot.room} with exception {err}"
            )
            raise ApiError(500, str(err), "InternalServerError")

    def _received(self, body: dict[str, Any], ids: list[int], text: str, asked: str) -> tuple[Facts | None, int]:
        boot = bootstrap_of(body, self.cfg.bootstrap_port)
        if boot is None or self.cfg.pd_mode != "decode":
            return None, 0
        # With its radix cache on, the decode tells the prefill how much of the prompt it holds already.
        skip = self.cache.checkpoints(ids)[-1:] if self.cfg.prefix_cache else []
        held = min(skip[0], len(ids) - 1) if skip else 0
        try:
            state = fetch_state(boot, held, self.timeouts_s.get(WAITING_TIMEOUT_ENV, 300.0))
        except TransferError as err:
            self.log.error(
                f"Decode transfer failed for request rank=0 decode_req.req.bootstrap_room={boot.room} with "
                f"exception {err}"
            )
            raise ApiError(500, str(err), "InternalServerError") from err
        # A radix hit saves the transfer of the prefix's MLA KV only: the KDA state the decode generates from is
        # the prefill's, after the whole prompt (the decode never computes a prompt, so a state lost in the
        # transfer is lost on a hit and cold alike).
        return received_facts(state, ids, held), len(ids) - held


def _as_chunks(body: dict[str, Any], text: bool = False) -> Generator[dict[str, Any], None, None]:
    """A prefill's one-token answer as the stream it was asked as (the router drains it unread)."""
    choice = body["choices"][0]
    head = {k: body[k] for k in ("id", "created", "model")}
    if text:
        yield {**head, "object": "text_completion",
               "choices": [{"index": 0, "text": choice["text"], "finish_reason": choice["finish_reason"]}]}
        return
    yield {**head, "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": choice["message"], "finish_reason": choice["finish_reason"]}]}
