"""Wrap an engine argv in `docker run` when the topology names an image."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from k3deploy.engines.redact import secret_env

SHM_SIZE = "32g"
STACK_BYTES = 67108864  # NVIDIA's recommended stack ulimit for CUDA containers (64 MiB)
# Ascend: the control devices every NPU container needs, plus the host driver and npu-smi.
ASCEND_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
ASCEND_MOUNTS = ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver/lib64",
                 "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info")


def container_name(deployment: str, rank: int) -> str:
    """k3-<deployment>-r<rank> (the topology name is already a valid container name)."""
    return f"k3-{deployment}-r{rank}"


def device_args(vendor: str, gpus_per_node: int) -> tuple[str, ...]:
    """The flags that give the container this vendor's accelerators."""
    if vendor == "nvidia":
        return ("--gpus", "all")
    if vendor == "amd":
        return ("--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video")
    if vendor == "huawei":
        npus = tuple(f"/dev/davinci{i}" for i in range(gpus_per_node))
        devs = tuple(a for d in (*npus, *ASCEND_DEVICES) for a in ("--device", d))
        return devs + tuple(a for m in ASCEND_MOUNTS for a in ("-v", f"{m}:{m}:ro"))
    return ()


def docker_argv(*, image: str, name: str, model_path: str, vendor: str, gpus_per_node: int,
                env: Mapping[str, str], secret_names: Iterable[str],
                argv: tuple[str, ...]) -> tuple[str, ...]:
    """`docker run -d`: host network and IPC, the model read-only at the same path, devices, env."""
    # Secrets (and secret-looking env) go in as `-e NAME`: docker copies the value from its own
    # environment, so none lands on a command line. `--entrypoint` replaces the image's own
    # (vllm/vllm-openai's is `vllm serve`), so argv runs exactly as rendered.
    out = ["docker", "run", "-d", "--name", name, "--network", "host", "--ipc", "host",
           "--shm-size", SHM_SIZE, "--ulimit", "memlock=-1", "--ulimit", f"stack={STACK_BYTES}",
           "-v", f"{model_path}:{model_path}:ro"]
    out += device_args(vendor, gpus_per_node)
    for k, v in env.items():
        out += ["-e", k] if secret_env(k, v) else ["-e", f"{k}={v}"]
    for k in secret_names:
        out += ["-e", k]
    return (*out, "--entrypoint", argv[0], image, *argv[1:])
