"""`serve`: one stand-in node from flags to serving, in the mimicked engine's order (rendezvous, load, caches, HTTP).

When a worker node dies after start-up, the head logs an error and keeps its HTTP server up, as the real
heads do: SGLang's head is stuck in a collective, so /health stays 200 while generation stalls; vLLM's
engine core is dead, so /health turns 503 and requests fail with 500. Stopping the group is the supervisor's
job. When the head dies, workers notice through the heartbeat within seconds and exit 1.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NoReturn

from k3deploy.catalog.specs import HardwareSpec, ModelSpec
from k3deploy.sim import startup_lines as lines
from k3deploy.sim.admission import Admission, admit, oom_line
from k3deploy.sim.chat_service import ChatService
from k3deploy.sim.engine_args import Mimic, parse_engine_args
from k3deploy.sim.faults import FaultError, Faults, parse_faults
from k3deploy.sim.http_api import ApiServer
from k3deploy.sim.log_format import EngineLog, first_gpu_ranks
from k3deploy.sim.model_info import ModelError, hardware, missing_shards, model_spec, read_config
from k3deploy.sim.rendezvous import NodeGroup, cause_of, watchdog
from k3deploy.sim.serve_config import ConfigError, ServeConfig, resolve_config

FAILED = 1


def _exit_now(code: int) -> NoReturn:
    # After Gloo is up, interpreter shutdown can block in the process group's destructor.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Node:
    """One stand-in node's start-up and serving."""

    def __init__(self, cfg: ServeConfig, model: ModelSpec, hw: HardwareSpec, faults: Faults, log: EngineLog) -> None:
        self.cfg, self.model, self.hw, self.faults, self.log = cfg, model, hw, faults, log
        self.adm: Admission = admit(cfg, model, hw, wrong_kernel="wrong_kernel" in faults)
        self.group = NodeGroup(cfg.rendezvous)
        self.service: ChatService | None = None
        self.api: ApiServer | None = None
        self.joined = False

    def fail(self, exception_line: str) -> int:
        """Log the engine's crash report and return (or, once in the Gloo group, exit with) status 1."""
        self.log.error(lines.failure_block(self.cfg, exception_line), where="core.py:735")
        if self.joined:
            _exit_now(FAILED)
        return FAILED

    def run(self) -> int:
        """Start up; on success serve until killed (never returns), else return the exit status."""
        cfg, log = self.cfg, self.log
        log.info(lines.server_args_line(cfg), source="server", where="utils.py:320")
        if cfg.mimic == "vllm":
            log.info(f"vLLM API server version {cfg.version}", source="server", where="api_server.py:1820")
            if not cfg.serves_api:
                log.info(lines.vllm_headless_line(cfg), source="server", where="launcher.py:85")
        elif cfg.decode_attention_backend == "flashmla":
            log.warning(lines.FLASHMLA_PAGE_LINE, source="server")
        if cfg.serves_api and not self._bind():
            return FAILED
        if not self._rendezvous():
            return FAILED
        return self._load_and_serve()

    def _bind(self) -> bool:
        self.service = ChatService(self.cfg, self.adm, self.log)
        try:
            self.api = ApiServer(self.service, self.log, self.cfg.bind_host, self.cfg.port, self._server_info())
        except OSError as exc:
            self.log.error(f"[Errno {exc.errno}] error while attempting to bind on address "
                           f"('{self.cfg.bind_host}', {self.cfg.port}): {exc.strerror}", source="server")
            return False
        self.api.start()  # answers 503 on /health until the engine is ready
        return True

    def _server_info(self) -> dict[str, object]:
        moe = self.adm.moe.backend if self.adm.moe.log_line else self.cfg.moe_backend
        return {**self.cfg.args, "model_path": self.cfg.model_path, "context_length": self.adm.context_length,
                "max_total_num_tokens": self.adm.budget.kv_tokens, "max_running_requests":
                self.adm.max_running_requests, "moe_runner_backend": moe, "version": self.cfg.version,
                "k3sim_gpu": self.hw.id}

    def _rendezvous(self) -> bool:
        cfg, log, rdv = self.cfg, self.log, self.cfg.rendezvous
        ranks = log.ranks
        self.group.load()
        if cfg.mimic == "sglang":
            log.info("Init parallel begin.", where="model_runner.py:640")
        else:
            log.info(lines.vllm_rank_lines(cfg, ranks, self.group.init_method)[0], where="parallel_state.py:1165")
        started = time.monotonic()
        if "hang_at_rendezvous" in self.faults:
            hang_s = self.faults.seconds("hang_at_rendezvous", 3600.0)
            log.warning(f"k3sim fault hang_at_rendezvous: node rank {rdv.node_rank} never joins (sleeping {hang_s:.0f} s)")
            time.sleep(hang_s)
            self.fail(f"RuntimeError: k3sim fault hang_at_rendezvous: gave up after {hang_s:.0f} s")
            return False

        def expired() -> None:
            log.error(f"Rendezvous failed: {self.group.describe()} did not complete within {rdv.timeout_s:.0f} s "
                      "(the configured timeout): the head is unreachable or not every node joined")

        try:
            with watchdog(rdv.timeout_s + 1.0, expired):
                total = self.group.join()
        except Exception as exc:  # noqa: BLE001 - every torch/Gloo failure is reported the same way
            cause, where = cause_of(exc), self.group.describe()
            if "timed out" in cause.lower() or "timeout" in cause.lower():
                log.error(f"Rendezvous failed: {where} did not complete within {rdv.timeout_s:.0f} s (the configured "
                          f"timeout): {cause}")
            else:
                log.error(f"Rendezvous failed: {where}: {cause}")
            _exit_now(FAILED)
        self.joined = True
        expected = rdv.nnodes * (rdv.nnodes + 1) / 2
        if total != expected:
            self.fail(f"RuntimeError: all_reduce check failed: got {total:g}, expected {expected:g}")
        elapsed = time.monotonic() - started
        log.info(f"k3sim: torch.distributed gloo group up at {self.group.init_method}: world_size={rdv.nnodes} "
                 f"(one rank per node), node_rank={rdv.node_rank}, all_reduce sum={total:g} as expected")
        if cfg.mimic == "sglang":
            log.info(f"Init parallel ends. elapsed={elapsed:.2f} s", where="model_runner.py:700")
        else:
            log.info(lines.vllm_rank_lines(cfg, ranks, self.group.init_method)[1], where="parallel_state.py:1420")
        return True

    def _load(self) -> float:
        """Log the weight-load lines; exits on an out-of-memory or a missing shard; return the load time."""
        cfg, log, adm = self.cfg, self.log, self.adm
        started = time.monotonic()
        if cfg.mimic == "sglang":
            log.info(lines.sglang_load_begin(adm), where="model_runner.py:760")
        else:
            log.info(lines.vllm_block_line(adm), where="config.py:420")
            log.info(f"Starting to load model {cfg.model_path}...", where="gpu_model_runner.py:3100")
            ep_line = lines.vllm_ep_line(adm, log.ranks, self.model)
            if ep_line:
                log.info(ep_line, where="layer.py:1310")
        if adm.moe.log_line:
            log.info(adm.moe.log_line, where="mxfp4.py:210")
        if "oom" in self.faults:
            self.fail(oom_line(adm.budget, self.hw, self.model.architecture.moe_layers))
        if adm.verdict == "oom" and adm.error:
            self.fail(adm.error)
        missing = missing_shards(cfg.model_path)
        if missing:
            self.fail(f"FileNotFoundError: [Errno 2] No such file or directory: '{cfg.model_path}/{missing[0]}'")
        if "slow_load" in self.faults:
            time.sleep(self.faults.seconds("slow_load", 10.0))
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
        self._barrier()
        if cfg.mimic == "sglang":
            log.info(lines.sglang_summary_line(cfg, adm), where="scheduler.py:560")
        self._go_live()
        return self._serve_forever()

    def _barrier(self) -> None:
        rdv = self.cfg.rendezvous
        if rdv.nnodes == 1:
            return

        def expired() -> None:
            if self.cfg.mimic == "vllm":
                self.log.error("TimeoutError: Timed out waiting for engine core processes to start. This is often "
                               f"caused by slow weight loading for large models. Waited {rdv.timeout_s:.0f} seconds "
                               "(configured by VLLM_ENGINE_READY_TIMEOUT_S).", source="server")
            else:
                self.log.error(f"Scheduler hit an exception: timed out after {rdv.timeout_s:.0f} s (--dist-timeout) "
                               f"waiting for all {rdv.nnodes} nodes to finish loading")

        try:
            with watchdog(rdv.timeout_s + 1.0, expired):
                self.group.barrier(0, rdv.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a node died while the others loaded
            self.fail(f"RuntimeError: lost a node while loading ({self.group.describe()}): {cause_of(exc)}")

    def _go_live(self) -> None:
        cfg, log = self.cfg, self.log
        if self.api is not None and self.service is not None:
            self.service.state = "ready"
            url = f"http://{cfg.bind_host}:{self.api.port}"
            if cfg.mimic == "sglang":
                log.raw(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)")
                log.info("The server is fired up and ready to roll!", source="server", where="http_server.py:1400")
            else:
                log.info(f"Starting vLLM server on {url}", source="server", where="api_server.py:1900")
                log.raw(f"(APIServer pid={os.getpid()}) INFO:     Application startup complete.")
        elif cfg.dummy_health:
            try:
                dummy = ApiServer(None, log, cfg.bind_host, cfg.port)
            except OSError as exc:
                self.fail(f"OSError: [Errno {exc.errno}] {exc.strerror}: ('{cfg.bind_host}', {cfg.port})")
            dummy.start()
            log.info(f"Dummy health check server started in background thread at {cfg.bind_host}:{dummy.port}",
                     source="server", where="engine.py:900")
        if cfg.rendezvous.nnodes > 1:
            self.group.start_heartbeat(self._on_lost)

    def _on_lost(self, rank: int, cause: str) -> None:
        if not self.cfg.head:
            self.log.error(f"Lost the head node ({self.group.init_method}): {cause}. Exiting.")
            _exit_now(FAILED)
        assert self.service is not None
        if self.cfg.mimic == "sglang":
            self.service.state = "stalled"
            self.log.error(f"Lost node rank {rank}: {cause}. The scheduler is stuck in a collective: /health stays "
                           "up, generation stalls until the group is stopped.")
        else:
            self.service.state = "dead"
            self.log.error(f"Worker on node rank {rank} died unexpectedly ({cause}). EngineCore encountered a fatal "
                           "error; /health now returns 503.", where="core.py:980")

    def _serve_forever(self) -> int:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()  # a server: it runs until a signal (or a lost head) ends it
        self.log.info("Received sigterm; shutting down.", source="server")
        _exit_now(0)


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
    ranks = first_gpu_ranks(rdv.node_rank, cfg.gpus_per_node, tp=cfg.tp, pp=cfg.pp, ep=cfg.ep, dp=cfg.dp,
                            attention_dp=cfg.attention_dp, nnodes=rdv.nnodes)
    log = EngineLog(mimic, ranks)
    try:
        faults = parse_faults(env, rdv.node_rank)
        model = model_spec(read_config(cfg.model_path))
        hw = hardware(env)
    except (FaultError, ModelError) as exc:
        log.error(str(exc), source="server")
        return FAILED
    return Node(cfg, model, hw, faults, log).run()
