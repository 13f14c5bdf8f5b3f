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


# `npu-smi info`: a summary row per NPU (id, name with a letter in it, health), then a chip row whose
# second cell is a PCI bus id: `| chip [phy-id] | 0000:9D:00.0 | ... HBM used / total |`. A2 lists one chip per
# NPU and no Phy-ID; A3 lists two chips per NPU (each a logical device), each with its Phy-ID.
_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+([A-Za-z0-9_.-]*[A-Za-z][A-Za-z0-9_.-]*)\s*\|\s*[A-Za-z]+\s*\|")
_CHIP_ROW = re.compile(r"^\|\s*(\d+)(?:\s+(\d+))?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*\|")
_NPU_HBM = re.compile(r"(\d+)\s*/\s*(\d+)\s*\|?\s*$")
# The process table: `| NPU  Chip | Process id | Process name | Process memory(MB) |`, then one row per process.
_NPU_PROC = re.compile(r"^\|\s*\d+(?:\s+\d+)?\s*\|\s*(\d+)\s*\|\s*(\S+)\s*\|\s*(\d+)\s*\|")


def npu_smi(outputs: Sequence[str]) -> Inventory:
    """`npu-smi info`: the version banner, a row pair per chip (summary: NPU id, name; chip row: Phy-ID, bus id,
    HBM used / total MB) and the process table."""
    text = outputs[0]
    ver = re.search(r"npu-smi\s+([0-9][0-9A-Za-z.]*)\s+Version:\s*([0-9][0-9A-Za-z.]*)", text)
    gpus: list[Gpu] = []
    procs: list[str] = []
    name, npu_id, in_procs = "", 0, False
    for line in text.splitlines():
        if "Process id" in line:
            in_procs = True
            continue
        if in_procs:
            p = _NPU_PROC.match(line)
            if p:
                procs.append(f"pid {p.group(1)} ({p.group(2)}, {p.group(3)} MB)")
            continue
        row = _NPU_ROW.match(line)
        if row:
            npu_id, name = int(row.group(1)), row.group(2)
            continue
        chip = _CHIP_ROW.match(line)
        if chip and name:
            hbm = _NPU_HBM.search(line)
            used, total = (int(hbm.group(1)) * MIB, int(hbm.group(2)) * MIB) if hbm else (0, 0)
            index = int(chip.group(2)) if chip.group(2) is not None else npu_id
            gpus.append(Gpu(index, name, total, used))
            name = ""
    if not gpus and "npu-smi" in text:
        raise ParseError("npu-smi: no NPU rows (an NPU row followed by a chip row with its bus id) in its output")
    return Inventory("npu-smi", tuple(gpus), ver.group(2) if ver else "", "", tuple(procs))


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
