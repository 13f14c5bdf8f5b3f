"""Start the real vLLM (the installer's venv) with a rendered command on this machine, wait until a real
completion answers (its /health says 200 before it can serve: real-engines.md), and stop it by process group,
leaving nothing: no process, no ZMQ IPC socket (VLLM_RPC_BASE_PATH is a private dir); its VLLM_CACHE_ROOT is the
run's (tests/conftest.py vllm_cache_root) or, without one, a private dir removed with the rest."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.polling import wait_for

# The CPU engine's environment (real-engines.md): a KV cache of this many GiB (else --gpu-memory-utilization
# reserves that share of ALL host RAM), no OpenMP thread pinning on a shared machine.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
READY_TIMEOUT_S = 900.0  # 30-80 s alone; a loaded 2-core machine is several times slower
STOP_GRACE_S = 30.0


def inductor_env(cache_root: Path) -> dict[str, str]:
    """torch inductor's cache in the run's cache root. At TP > 1 every worker torch.compile's vLLM's vocab
    masking (vocab_parallel_embedding.py get_masked_input_and_mask, inductor, even with --enforce-eager); its
    cache defaults to $TMPDIR/torchinductor_$USER, which was a start's own scratch dir: every worker of every
    start built it again with gcc (measured: 42 s cold, 10 s warm on the loaded machine), where a user's cache
    is built once."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_root / "torchinductor")}


class EngineFailed(RuntimeError):
    """The engine exited or never answered; the message ends with its log."""


@dataclass
class RealVllm:
    """One running `vllm serve` and where it keeps its files."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    scratch: Path
    started_s: float = field(default_factory=time.monotonic)
    ready_s: float | None = None

    @property
    def ipc_dir(self) -> Path:
        """Where its ZMQ IPC sockets are (VLLM_RPC_BASE_PATH)."""
        return self.scratch / "ipc"

    def log(self) -> str:
        """Everything it has printed so far."""
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        return "\n".join(self.log().splitlines()[-lines:])


def spawn_vllm(argv: Sequence[str], env: Mapping[str, str] | None = None, cache_root: Path | None = None) -> RealVllm:
    """Run argv (a rendered `vllm serve ...`, argv[0] the venv's vllm) in its own session, not waiting for
    it (a headless node never serves). The URL is the one argv's --port names."""
    port = argv[list(argv).index("--port") + 1]
    # Short: a unix socket path is at most 107 bytes, and vLLM adds "/" + a 36-character uuid4.
    scratch = Path(tempfile.mkdtemp(prefix="k3rt-", dir="/tmp"))
    (scratch / "ipc").mkdir()
    cache = cache_root or scratch / "cache"
    # TMPDIR: vLLM's file-store rendezvous (/tmp/vllm_dist_<uuid>, left behind by a killed engine) lands in the
    # scratch dir, removed at the stop; the inductor cache is not there but in the cache root (inductor_env).
    full_env = {**os.environ, **CPU_ENV, "VLLM_CACHE_ROOT": str(cache), **inductor_env(cache),
                "VLLM_RPC_BASE_PATH": str(scratch / "ipc"), "TMPDIR": str(scratch), **(env or {})}
    log_path = scratch / "engine.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
    return RealVllm(proc, f"http://127.0.0.1:{port}", log_path, scratch)


def start_vllm(argv: Sequence[str], model: str, env: Mapping[str, str] | None = None,
               ready_timeout_s: float = READY_TIMEOUT_S, cache_root: Path | None = None) -> RealVllm:
    """spawn_vllm, then return when a completion for `model` answers."""
    engine = spawn_vllm(argv, env, cache_root)
    try:
        _wait_serving(engine, model, ready_timeout_s)
    except BaseException:
        stop_vllm(engine)  # the error carries the log's end
        raise
    engine.ready_s = time.monotonic() - engine.started_s
    return engine


def _wait_serving(engine: RealVllm, model: str, timeout_s: float) -> None:
    body = {"model": model, "prompt": "ready?", "max_tokens": 1, "temperature": 0}

    def answered() -> bool:
        if engine.proc.poll() is not None:
            raise EngineFailed(f"vllm exited with status {engine.proc.returncode} before serving:\n{engine.tail()}")
        try:
            reply = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=60.0)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200 and bool(reply.json().get("choices"))

    if not wait_for(answered, timeout_s, step_s=1.0):
        raise EngineFailed(f"no completion from vllm within {timeout_s:.0f} s:\n{engine.tail()}")


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_vllm(engine: RealVllm) -> None:
    """SIGTERM the whole process group (API server, engine core, workers), SIGKILL what is left after the
    grace, reap; then remove its scratch dir (log, compile cache, IPC sockets)."""
    pgid = engine.proc.pid
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
        if not wait_for(lambda: not group_alive(pgid) or _reaped(engine), STOP_GRACE_S, step_s=0.2):
            os.killpg(pgid, signal.SIGKILL)
    try:
        engine.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        engine.proc.wait(timeout=60)
    if group_alive(pgid):  # children outliving the leader (reparented, not yet gone)
        os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: not group_alive(pgid), 60, step_s=0.2)
    shutil.rmtree(engine.scratch, ignore_errors=True)


def _reaped(engine: RealVllm) -> bool:
    engine.proc.poll()
    return engine.proc.returncode is not None and not group_alive(engine.proc.pid)
