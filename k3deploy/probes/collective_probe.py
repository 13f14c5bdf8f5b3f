"""Run by the engine's interpreter on every node at once (shipped by source; needs torch, nothing of
k3deploy): join the process group at the engine's rendezvous address with the engine's environment,
all_reduce a tensor whose sum is known, time it. One JSON line; a wall-clock watchdog bounds it because
torch's own timeouts are not hard bounds (a closed port retries for 24-49 s past a 20 s timeout).

argv: INIT_METHOD (tcp://HEAD:PORT) RANK WORLD BYTES TIMEOUT_S BACKENDS (gloo[,nccl|hccl]). HCCL needs torch_npu
(it registers the backend and the npu device); without it the HCCL part is skipped and the answer says so."""
import json
import os
import sys
import threading
import time

state = {"stage": "import torch", "t0": time.monotonic()}
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")
DEVICES = {"nccl": "cuda", "hccl": "npu"}  # the accelerator backends and their torch device
lock = threading.Lock()
done = threading.Event()


def emit(result):
    with lock:
        if done.is_set():
            return
        done.set()
        result.setdefault("stage", state["stage"])
        result["ifname"] = {k: os.environ.get(k) for k in IFNAME_VARS if k in os.environ}
        result["elapsed_s"] = round(time.monotonic() - state["t0"], 3)
        print(json.dumps(result), flush=True)


def watchdog(timeout_s):
    def fire():
        emit({"ok": False, "error": f"no progress for {timeout_s:g} s (watchdog)", "timeout": True})
        os._exit(0)  # the main thread may be stuck inside Gloo or TCPStore C++ code

    t = threading.Timer(timeout_s, fire)
    t.daemon = True
    t.start()


def first_line(exc):
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:400]


def no_torch_npu():
    """'' when torch_npu imports (registering HCCL and the npu device), else why not."""
    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - its absence is the finding
        return first_line(exc)
    return ""


def main():
    init, rank, world, nbytes, timeout_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    backends = sys.argv[6].split(",")
    try:
        import datetime

        import torch
        import torch.distributed as dist
    except Exception as exc:  # noqa: BLE001 - no torch on the node is the finding
        emit({"ok": False, "error": first_line(exc), "no_torch": True})
        return
    watchdog(timeout_s)  # import time is not counted: it depends on the disk, not the network
    state["stage"] = "init_process_group"
    out = {"ok": True, "rank": rank, "results": {}}
    try:
        dist.init_process_group(backends[0], init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        for backend in backends:
            if backend == "hccl":
                missing = no_torch_npu()
                if missing:
                    out["results"][backend] = {"skipped": f"no torch_npu in the engine's interpreter ({missing}): "
                                                          "HCCL not probed"}
                    continue
            group = None if backend == backends[0] else dist.new_group(backend=backend)
            device = DEVICES.get(backend, "cpu")
            accel = getattr(torch, device) if device != "cpu" else None
            if accel is not None:
                accel.set_device(0)
            n = max(1, nbytes // 4)
            t = torch.full((n,), float(rank + 1), dtype=torch.float32, device=device)
            state["stage"] = f"{backend} warm-up all_reduce"
            dist.all_reduce(t[:1024].clone(), group=group)
            state["stage"] = f"{backend} all_reduce"
            if accel is not None:
                accel.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(t, group=group)
            if accel is not None:
                accel.synchronize()
            secs = time.perf_counter() - t0
            want = world * (world + 1) / 2
            bad = int((t != want).sum().item())
            algbw = n * 4 / secs / 1e9
            out["results"][backend] = {"seconds": round(secs, 5), "bytes": n * 4, "algbw_gbps": round(algbw, 4),
                                       "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4),
                                       "wrong_elements": bad, "expected": want}
            if bad:
                out["ok"] = False
                out["error"] = f"{backend} all_reduce gave {bad} wrong elements (expected every element {want:g})"
        state["stage"] = "destroy"
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the failure text is the diagnosis
        emit({"ok": False, "error": first_line(exc)})
        os._exit(0)  # Gloo threads may still hold the process
    emit(out)
    os._exit(0)


if __name__ == "__main__":
    main()
