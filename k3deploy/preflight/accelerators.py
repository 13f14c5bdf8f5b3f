"""Accelerator inventories from the vendor tools' machine-readable output (nvidia-smi CSV, amd-smi and
rocm-smi JSON, npu-smi text), parsed here so every node only runs the tool."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

MIB = 2**20
NVIDIA_GPU_FIELDS = ("index", "name", "memory.total", "memory.used", "driver_version")
# Each tool: the argv list the node runs (in this order); the parser gets their outputs.
TOOL_QUERIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "nvidia": (
        ("nvidia-smi", f"--query-gpu={','.join(NVIDIA_GPU_FIELDS)}", "--format=csv,noheader,nounits"),
        ("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"),
        ("nvidia-smi",),  # the banner is the only place that states the CUDA version the driver supports
    ),
    "amd": (("amd-smi", "static", "--asic", "--vram", "--driver", "--json"),
            ("amd-smi", "process", "--json")),
    "rocm": (("rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showdriverversion", "--json"),),
    "huawei": (("npu-smi", "info"),),
}
TOOL_OF_VENDOR = {"nvidia": ("nvidia",), "amd": ("amd", "rocm"), "huawei": ("huawei",)}


@dataclass(frozen=True)
class Gpu:
    """One accelerator as its vendor tool reports it."""

    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int


@dataclass(frozen=True)
class Inventory:
    """A node's accelerators, driver and toolkit versions, and processes holding accelerator memory."""

    tool: str
    gpus: tuple[Gpu, ...]
    driver: str
    toolkit: str  # CUDA / ROCm / CANN version ('' when the tool does not say)
    processes: tuple[str, ...] = ()


class ParseError(ValueError):
    """The tool's output is not in the format this parser knows."""


def nvidia(outputs: Sequence[str]) -> Inventory:
    """`nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader,nounits`
    (MiB), the compute-apps query, and the banner for 'CUDA Version: X'."""
    gpus, drivers = [], set()
    for line in outputs[0].splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(NVIDIA_GPU_FIELDS):
            raise ParseError(f"nvidia-smi: expected {len(NVIDIA_GPU_FIELDS)} CSV fields, got {line!r}")
        try:
            gpus.append(Gpu(int(cells[0]), cells[1], int(float(cells[2]) * MIB), int(float(cells[3]) * MIB)))
        except ValueError:
            raise ParseError(f"nvidia-smi: not numbers in {line!r}") from None
        drivers.add(cells[4])
    procs = tuple(f"pid {c[0].strip()} ({c[1].strip()}, {c[2].strip()} MiB)" for c in
                  (line.split(",") for line in (outputs[1] if len(outputs) > 1 else "").splitlines()) if len(c) >= 3)
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", outputs[2] if len(outputs) > 2 else "")
    return Inventory("nvidia-smi", tuple(gpus), ",".join(sorted(drivers)), cuda.group(1) if cuda else "", procs)


def _json(text: str, tool: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise ParseError(f"{tool}: output is not JSON") from None


def _bytes(value: object) -> int:
    """A memory size from amd-smi ({value, unit}) or rocm-smi (bytes as a string)."""
    if isinstance(value, dict):
        unit = str(value.get("unit", "MB")).upper()
        scale = {"B": 1, "KB": 2**10, "MB": MIB, "GB": 2**30}.get(unit, MIB)
        return int(float(value.get("value", 0)) * scale)
    return int(float(str(value).split()[0])) if value not in (None, "", "N/A") else 0


def amd_smi(outputs: Sequence[str]) -> Inventory:
    """`amd-smi static --asic --vram --driver --json` and `amd-smi process --json`."""
    data = _json(outputs[0], "amd-smi")
    items = data if isinstance(data, list) else data.get("gpu_data", []) if isinstance(data, dict) else []
    gpus, drivers = [], set()
    for i, g in enumerate(items):
        asic, vram, drv = g.get("asic", {}), g.get("vram", {}), g.get("driver", {})
        gpus.append(Gpu(int(g.get("gpu", i)), str(asic.get("market_name", "")), _bytes(vram.get("size")), 0))
        drivers.add(str(drv.get("version", "")))
    procs: list[str] = []
    if len(outputs) > 1 and outputs[1].strip():
        listed = _json(outputs[1], "amd-smi process")
        for g in listed if isinstance(listed, list) else []:
            for p in g.get("process_list", []) if isinstance(g, dict) else []:
                info = p.get("process_info", p)
                if isinstance(info, dict) and info.get("pid"):
                    procs.append(f"pid {info['pid']} ({info.get('name', '?')})")
    return Inventory("amd-smi", tuple(gpus), ",".join(sorted(drivers)), "", tuple(procs))


def rocm_smi(outputs: Sequence[str]) -> Inventory:
    """`rocm-smi --showproductname --showmeminfo vram --showdriverversion --json`."""
    data = _json(outputs[0], "rocm-smi")
    if not isinstance(data, dict):
        raise ParseError("rocm-smi: expected a JSON object")
    gpus, driver = [], str(data.get("system", {}).get("Driver version", ""))
    for key, card in sorted(data.items()):
        if not key.startswith("card"):
            continue
        gpus.append(Gpu(int(key[4:]), str(card.get("Card Series") or card.get("Card series") or ""),
                        _bytes(card.get("VRAM Total Memory (B)")), _bytes(card.get("VRAM Total Used Memory (B)"))))
    return Inventory("rocm-smi", tuple(gpus), driver, "")


_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|")
_NPU_HBM = re.compile(r"(\d+)\s*/\s*(\d+)\s*\|?\s*$")


def npu_smi(outputs: Sequence[str]) -> Inventory:
    """`npu-smi info`: the version banner and the per-NPU rows (row 1: id, name; row 2: HBM used / total MB)."""
    text = outputs[0]
    ver = re.search(r"npu-smi\s+([0-9][0-9A-Za-z.]*)\s+Version:\s*([0-9][0-9A-Za-z.]*)", text)
    gpus: list[Gpu] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _NPU_ROW.match(line)
        if m and i + 1 < len(lines):
            hbm = _NPU_HBM.search(lines[i + 1])
            used, total = (int(hbm.group(1)) * MIB, int(hbm.group(2)) * MIB) if hbm else (0, 0)
            gpus.append(Gpu(int(m.group(1)), m.group(2), total, used))
    return Inventory("npu-smi", tuple(gpus), ver.group(2) if ver else "", "")


PARSERS = {"nvidia": nvidia, "amd": amd_smi, "rocm": rocm_smi, "huawei": npu_smi}


def model_matches(catalog_id: str, catalog_name: str, reported: str) -> bool:
    """The reported product name names the catalog's accelerator (h100 in 'NVIDIA H100 80GB HBM3')."""
    squash = re.sub(r"[^a-z0-9]", "", reported.lower())
    key = re.sub(r"[^a-z0-9]", "", catalog_id.split("-")[0].lower())
    if key and key in squash:
        return True
    # Ascend ids name the system (a2, a3); the chip name is in the catalog name (910B, 910C -> 910).
    chip = re.search(r"(\d{3})[A-Z]?", catalog_name)
    return bool(chip and chip.group(1) in squash)
