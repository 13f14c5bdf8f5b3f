"""vLLM's NixlConnector P/D as a PD router (vllm-router --vllm-pd-disaggregation) drives it, seen running
vllm-router 0.1.17: the router first sends the prefill the request with max_tokens 1 and kv_transfer_params
{do_remote_decode: true}; the prefill answers at once with kv_transfer_params naming its engine id,
request id and side channel (VLLM_NIXL_SIDE_CHANNEL_HOST, default localhost, and _PORT, default 5600, plus
the DP rank; nixl/base_scheduler.py) and its own prefix-cache hit (remote_prefill_cached_tokens,
v1/core/sched/scheduler.py); the router passes those to the decode, which reads the KV from that side channel
(the stand-in: plain HTTP, as disaggregation.py), generates, and reports the prefill's hit as its
cached_tokens (v1/engine/output_processor.py). The decode keeps a prefix cache of its own: the connector
pulls only the prompt past its local hit (nixl/pull_scheduler.py get_num_new_matched_tokens). A failed load fails the request
("Internal server error", 500) unless kv_load_failure_policy is recompute (v1/core/sched/scheduler.py)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from k3deploy.sim.chat_service import ApiError, ChatService, Reply
from k3deploy.sim.disaggregation import Bootstrap, BootstrapServer, TransferError, fetch_state, received_facts
from k3deploy.sim.recall import Facts, read_facts
from k3deploy.sim.tokens import message_text, render_prompt

SIDE_CHANNEL_HOST_ENV, SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"
DEFAULT_SIDE_CHANNEL = ("localhost", 5600)
ABORT_TIMEOUT_S = 480.0  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT: how long a prefill keeps blocks nobody read


class NixlChatService(ChatService):
    """A vLLM server with the NixlConnector (kv_both): prefills or decodes as each request's params say."""

    side_channel: BootstrapServer | None = None
    engine_id = ""
    advertised: tuple[str, int] = DEFAULT_SIDE_CHANNEL

    def start_role(self, env: Mapping[str, str]) -> bool:
        """The side channel every NIXL engine listens on (False: the port is taken, logged)."""
        host = env.get(SIDE_CHANNEL_HOST_ENV) or DEFAULT_SIDE_CHANNEL[0]
        port = int(env.get(SIDE_CHANNEL_PORT_ENV) or DEFAULT_SIDE_CHANNEL[1]) + int(
            self.cfg.args.get("data_parallel_rank") or 0)
        self.engine_id, self.advertised = str(uuid.uuid4()), (host, port)
        try:
            self.side_channel = BootstrapServer(host, port, {"engine_id": self.engine_id, "tp_size": self.cfg.tp},
                                                self.faults, ABORT_TIMEOUT_S)
        except OSError as exc:
            self.log.error(f"OSError: [Errno {exc.errno}] {exc.strerror}: NIXL side channel on ('{host}', {port})")
            return False
        self.side_channel.start()
        return True

    def chat(self, body: Any) -> Reply:
        """A prefill's part (do_remote_decode), else as usual (a decode's part reads its KV in _received)."""
        params = body.get("kv_transfer_params") if isinstance(body, dict) else None
        if not isinstance(params, dict) or not params.get("do_remote_decode") or self.side_channel is None:
            return super().chat(body)
        reply = super().chat({k: v for k, v in body.items() if k != "kv_transfer_params"} | {"stream": False})
        assert reply.body is not None
        messages = body["messages"]
        prompt = render_prompt(messages, body.get("tools") if body.get("tool_choice") != "none" else None)
        asked = message_text(messages[-1].get("content")) if messages[-1].get("role") == "user" else ""
        request_id = str(reply.body["id"])
        self.side_channel.rooms.publish(request_id, prompt.ids, read_facts(prompt.text, asked))
        host, port = self.advertised
        reply.body["kv_transfer_params"] = {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0],
            "remote_engine_id": self.engine_id, "remote_request_id": request_id, "remote_host": host,
            "remote_port": port, "tp_size": self.cfg.tp, "remote_prefill_cached_tokens": reply.cached,
        }
        return reply

    def _job_args(self, body: dict[str, Any]) -> dict[str, Any]:
        """A decode's usage reports the prefill's hit that the router passed on (its own hit only speeds the
        load: the NIXL connector pulls just the prompt tokens past the decode's local prefix hit)."""
        params = body.get("kv_transfer_params")
        hit = params.get("remote_prefill_cached_tokens") if isinstance(params, dict) and params.get(
            "do_remote_prefill") else None
        return {**super()._job_args(body), **({"reported_hit": hit} if isinstance(hit, int) else {})}

    def _received(self, body: dict[str, Any], ids: list[int], text: str, asked: str) -> tuple[Facts | None, int]:
        params = body.get("kv_transfer_params")
        if not isinstance(params, dict) or not params.get("do_remote_prefill"):
            return None, 0
        room = str(params.get("remote_request_id"))
        try:
            boot = Bootstrap(str(params["remote_host"]), int(params["remote_port"]), room)
            # A hybrid model's KDA state is split by TP: prefill and decode must run the same TP.
            expect = {"engine_id": params.get("remote_engine_id"), "tp_size": self.cfg.tp}
            state = fetch_state(boot, 0, ABORT_TIMEOUT_S, expect)
        except (KeyError, TypeError, ValueError, TransferError) as exc:
            if self.cfg.kv_failure_policy == "recompute":
                self.log.warning(f"KV load failed for request {room} ({exc}); recomputing its prompt")
                return None, 0
            self.log.error(f"KV load failed for request {room}: {exc}")
            self.log.error(f"Request {room} failed with an internal error during generation", where="serving.py:203")
            raise ApiError(500, "Internal server error", "InternalServerError") from exc
        return received_facts(state, ids, 0), len(ids)
