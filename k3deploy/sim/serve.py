"""`serve`: one stand-in node from flags to serving, in the engine's order (rendezvous, load, caches, HTTP).

When a worker node dies after start-up, the head's /health stays 200, as the real heads' do: SGLang's head
is stuck in a collective, so generation stalls and the process waits to be stopped; vLLM's notices nothing
until its next request, which fails 500, then exits 0 (peer_loss.py). Stopping the group is the supervisor's
job. A lost head: workers exit 1 within seconds (heartbeat); vLLM's headless never notices (outlive_head).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NoReturn

from k3deploy.catalog.specs import HardwareSpec, ModelSpec
from k3deploy.sim import startup_lines as lines
from k3deploy.sim.admission import VLLM_FP4_MARLIN_WARNING, Admission, admit, oom_line
from k3deploy.sim.chat_service import ChatService
from k3deploy.sim.engine_args import Mimic, parse_engine_args
from k3deploy.sim.faults import SLOW_LOAD_DEFAULT_S, SLOW_STOP_DEFAULT_S, FaultError, Faults, parse_faults
from k3deploy.sim.http_api import ApiServer
from k3deploy.sim.log_format import EngineLog, first_gpu_ranks
from k3deploy.sim.membership import FAILED, Membership, exit_now
from k3deploy.sim.model_info import ModelError, hardware, missing_shards, model_spec, read_config
from k3deploy.sim.nixl_service import NixlChatService
from k3deploy.sim.pacing import PacingError, PerfModel, speed_factor
from k3deploy.sim.pd_service import PdChatService
from k3deploy.sim.peer_loss import LostPeer, keep_alive, shut_down_after_reply
from k3deploy.sim.serve_config import ConfigError, ServeConfig, resolve_config

LIFETIME_ENV = "K3SIM_MAX_LIFETIME_S"
SLOW_DECODE_DEFAULT = 10.0  # the slow_decode fault's factor on each decode step
# A forgotten stand-in (a test runner killed mid-run) stops by itself after a day.
DEFAULT_LIFETIME_S = 86400.0


class Node:
    """One stand-in node's start-up and serving."""

    def __init__(
        self,
        cfg: ServeConfig,
        model: ModelSpec,
        hw: HardwareSpec,
        faults: Faults,
        log: EngineLog,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        speed: float = 1.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        # Faults that make the engine serve otherwise than its flags say (what validate must notice).
        cfg = dataclasses.replace(cfg, prefix_cache=cfg.prefix_cache and "no_prefix_cache" not in faults,
                                  cache_report=cfg.cache_report and "no_cache_report" not in faults)
        self.cfg, self.model, self.hw, self.faults, self.log = cfg, model, hw, faults, log
        self.lifetime_s = lifetime_s
        self.env: Mapping[str, str] = {} if env is None else env
        self.adm: Admission = admit(cfg, model, hw, wrong_kernel="wrong_kernel" in faults)
        if "short_context" in faults:
            short = int(faults.value("short_context", self.adm.context_length // 4))
            self.adm = dataclasses.replace(self.adm, context_length=short)
        b = self.adm.budget
        self.perf = PerfModel.build(
            model,
            hw,
            attn_tp=self.adm.shape.attn_tp,
            expert_shards=self.adm.shape.expert_shards,
            kv_bytes_per_token=b.mla_kv_bytes_per_token,
            state_bytes_per_request=b.kda_state_bytes_per_slot,  # one live state per running request
            dcp=self.adm.shape.dcp,
            speed=speed,
            decode_slowdown=faults.value("slow_decode", SLOW_DECODE_DEFAULT) if "slow_decode" in faults else 1.0,
        )
        self.members = Membership(cfg, log, faults)
        self.service: ChatService | None = None
        self.api: ApiServer | None = None

    def fail(self, exception_line: str) -> NoReturn:
        """Log the engine's crash report and exit 1."""
        self.members.crash(exception_line)

    def run(self) -> int:
        """Start up; on success serve until killed (never returns), else return the exit status."""
        cfg, log = self.cfg, self.log
        attention = lines.sglang_attention_line(cfg, self.hw) if cfg.mimic == "sglang" else None
        if attention:
            log.info(attention, source="server", where="server_args.py:1650")
        log.info(lines.server_args_line(cfg, self.hw, self._moe_asked()), source="server", where="utils.py:320")
        if cfg.mimic == "vllm":
            log.info(f"vLLM API server version {cfg.version}", source="server", where="api_server.py:1820")
            if not cfg.serves_api:
                log.info(lines.vllm_headless_line(cfg), source="server", where="launcher.py:85")
        elif cfg.decode_attention_backend == "flashmla":
            log.warning(lines.FLASHMLA_PAGE_LINE, source="server")
        if cfg.serves_api and not self._bind():
            return FAILED
        self.members.join()
        return self._load_and_serve()

    def _bind(self) -> bool:
        kind = {"nixl": NixlChatService, None: ChatService}.get(self.cfg.pd_mode, PdChatService)
        self.service = kind(self.cfg, self.adm, self.log, self.perf, faults=self.faults, vision=self.model.vision)
        if isinstance(self.service, (PdChatService, NixlChatService)) and not self.service.start_role(self.env):
            return False
        try:
            self.api = ApiServer(
                self.service, self.log, self.cfg.bind_host, self.cfg.port, self._server_info()
            )
        except OSError as exc:
            self.log.error(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"('{self.cfg.bind_host}', {self.cfg.port}): {exc.strerror}",
                source="server",
            )
            return False
        self.api.start()  # answers 503 on /health until the engine is ready
        return True

    def _moe_asked(self) -> str:
        # SGLang's argument handling rewrites the MoE backend only where it logs that it did.
        return self.adm.moe.backend if self.adm.moe.log_line else self.cfg.moe_backend

    def _server_info(self) -> dict[str, object]:
        moe = self._moe_asked()
        return {
            **self.cfg.args,
            "model_path": self.cfg.model_path,
            "context_length": self.adm.context_length,
            "max_total_num_tokens": self.adm.budget.kv_tokens,
            "max_running_requests": self.adm.max_running_requests,
            "moe_runner_backend": moe,
            "version": self.cfg.version,
            "k3sim_gpu": self.hw.id,
            "k3sim_pacing": self.perf.describe(),
        }

    def _load(self) -> float:
        """Log the weight-load lines; exits on an out-of-memory or a missing shard; return the load time."""
        cfg, log, adm = self.cfg, self.log, self.adm
        started = time.monotonic()
        if cfg.mimic == "sglang":
            log.info(lines.sglang_load_begin(adm), where="model_runner.py:760")
        else:
            log.info(lines.vllm_block_line(adm), where="config.py:420")
            log.info(lines.vllm_attention_line(cfg, self.hw), where="cuda.py:380")
            log.info(f"Starting to load model {cfg.model_path}...", where="gpu_model_runner.py:3100")
            ep_line = lines.vllm_ep_line(adm, log.ranks, self.model)
            if ep_line:
                log.info(ep_line, where="layer.py:1310")
        if adm.moe.log_line:
            log.info(adm.moe.log_line, where="mxfp4.py:210")
        if cfg.mimic == "vllm" and adm.moe.backend == "marlin" and not self.hw.native_mxfp4:
            log.warning(VLLM_FP4_MARLIN_WARNING, where="marlin_utils_fp4.py:90")
        if "oom" in self.faults:
            self.fail(oom_line(adm.budget, self.hw, self.model.architecture.moe_layers))
        if adm.verdict == "oom" and adm.error:
            self.fail(adm.error)
        missing = missing_shards(cfg.model_path)
        if missing:
            self.fail(
                f"FileNotFoundError: [Errno 2] No such file or directory: '{cfg.model_path}/{missing[0]}'"
            )
        if "slow_load" in self.faults:
            time.sleep(self.faults.seconds("slow_load", SLOW_LOAD_DEFAULT_S))
        return time.monotonic() - started

    def _load_and_serve(self) -> int:
        cfg, log, adm = self.cfg, self.log, self.adm
        elapsed = self._load()
        if cfg.mimic == "sglang":
            log.info(lines.sglang_load_end(adm, elapsed), where="model_runner.py:820")
            if adm.error:
                self.fail(adm.error)
            for line in lines.sglang_cache_lines(adm, self.model):
                log.info(line, where="memory_pool.py:300")
        else:
            for line in lines.vllm_load_lines(adm, elapsed):
                log.info(line, where="gpu_worker.py:300")
            if adm.error:
                self.fail(adm.error)
            log.info(lines.vllm_kv_size_line(adm), where="kv_cache_utils.py:1100")
        if "crash_after_load" in self.faults:
            self.fail("RuntimeError: k3sim fault injection: crash_after_load")
        self.members.wait_all_loaded()
        if cfg.mimic == "sglang":
            log.info(lines.sglang_summary_line(cfg, adm), where="scheduler.py:560")
        self._go_live()
        return self._serve_forever()

    def _go_live(self) -> None:
        cfg, log = self.cfg, self.log
        if self.api is not None and self.service is not None:
            self.service.state = "ready"
            url = f"http://{cfg.bind_host}:{self.api.port}"
            if cfg.mimic == "sglang":
                log.raw(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")
                log.info(
                    "The server is fired up and ready to roll!", source="server", where="http_server.py:1400"
                )
            else:
                log.info(f"Starting vLLM server on {url}", source="server", where="api_server.py:1900")
                log.raw(f"(APIServer pid={os.getpid()}) INFO:     Application startup complete.")
        elif cfg.dummy_health:
            try:
                dummy = ApiServer(None, log, cfg.bind_host, cfg.port)
            except OSError as exc:
                self.fail(f"OSError: [Errno {exc.errno}] {exc.strerror}: ('{cfg.bind_host}', {cfg.port})")
            dummy.start()
            log.info(
                f"Dummy health check server started in background thread at {cfg.bind_host}:{dummy.port}",
                source="server",
                where="engine.py:900",
            )
        self.members.watch(self._lost_worker, self.lifetime_s)

    def _lost_worker(self, rank: int, cause: str) -> None:
        assert self.service is not None
        if self.cfg.mimic == "sglang":
            self.service.state = "stalled"
            self.log.error(
                f"Lost node rank {rank}: {cause}. The scheduler is stuck in a collective: /health stays "
                "up, generation stalls until the group is stopped."
            )
        else:  # real vLLM logs nothing now: its next request fails, then it shuts down (peer_loss.py)
            self.service.lost_peer = LostPeer(rank, cause)
            self.service.on_death = self._engine_died
            self.service.state = "peer_lost"
            self.log.info(f"k3sim: lost node rank {rank} ({cause}); as vLLM, the next request will fail")

    def _engine_died(self) -> None:
        if not keep_alive(self.env):
            shut_down_after_reply(self.log, exit_now)

    def _serve_forever(self) -> NoReturn:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if stop.wait(self.lifetime_s):
            self.log.info("Received sigterm; shutting down.", source="server")
            if "slow_stop" in self.faults:
                time.sleep(self.faults.seconds("slow_stop", SLOW_STOP_DEFAULT_S))
        else:
            self.log.info(
                f"k3sim: {LIFETIME_ENV}={self.lifetime_s:.0f} s reached; shutting down.", source="server"
            )
        exit_now(0)


def with_faults(cfg: ServeConfig, faults: Faults) -> ServeConfig:
    """The configuration the engine really runs under the configuration faults."""
    if "wrong_topology" in faults:
        ep = 1 if cfg.ep > 1 else cfg.tp  # as if --ep-size were ignored (or experts split although not asked)
        # SGLang reports its resolved arguments; vLLM's logged arguments stay as parsed.
        args = {**cfg.args, "ep_size": ep} if cfg.mimic == "sglang" else cfg.args
        cfg = dataclasses.replace(cfg, ep=ep, args=args)
    if "no_reasoning_parser" in faults:
        cfg = dataclasses.replace(cfg, reasoning_parser=None)
    if "no_tool_parser" in faults:
        cfg = dataclasses.replace(cfg, tool_parser=f"{cfg.tool_parser} (not loaded)")
    return cfg


def serve_main(mimic: Mimic, argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run one stand-in node; return its exit status (argparse errors exit 2 by themselves)."""
    env = os.environ if env is None else env
    ns = parse_engine_args(mimic, argv)
    try:
        cfg = resolve_config(mimic, ns, env)
    except ConfigError as exc:
        print(exc, file=sys.stderr, flush=True)
        return FAILED
    rdv = cfg.rendezvous
    try:
        faults = parse_faults(env, rdv.node_rank)
    except FaultError as exc:
        print(exc, file=sys.stderr, flush=True)
        return FAILED
    cfg = with_faults(cfg, faults)
    ranks = first_gpu_ranks(
        rdv.node_rank,
        cfg.gpus_per_node,
        tp=cfg.tp,
        pp=cfg.pp,
        ep=cfg.ep,
        dp=cfg.dp,
        attention_dp=cfg.attention_dp,
        nnodes=rdv.nnodes,
    )
    log = EngineLog(mimic, ranks)
    try:
        model = model_spec(read_config(cfg.model_path))
        hw = hardware(env)
        lifetime_s = float(env.get(LIFETIME_ENV) or DEFAULT_LIFETIME_S)
        speed = speed_factor(env)
        node = Node(cfg, model, hw, faults, log, lifetime_s, speed, env)
    except (ModelError, PacingError, ValueError) as exc:
        log.error(str(exc), source="server")
        return FAILED
    return node.run()
