"""Vendor-tool parsers (real output formats), cross-node agreement, the collective probe's diagnosis, and
the report's exit codes, JSON and JUnit forms."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.preflight import accelerators as acc
from k3deploy.preflight.context import agree
from k3deploy.preflight.rendezvous import diagnose
from k3deploy.preflight.report import CheckResult, Report, Verdict
from k3deploy.preflight.views import write_junit

NVIDIA_CSV = ("0, NVIDIA H100 80GB HBM3, 81559, 4, 550.54.15\n"
              "1, NVIDIA H100 80GB HBM3, 81559, 40960, 550.54.15\n")
NVIDIA_APPS = "12345, python3, 40950\n"
NVIDIA_BANNER = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n"
ROCM_JSON = json.dumps({
    "card0": {"Card Series": "AMD Instinct MI355X", "VRAM Total Memory (B)": "309220868096",
              "VRAM Total Used Memory (B)": "297799680"},
    "card1": {"Card Series": "AMD Instinct MI355X", "VRAM Total Memory (B)": "309220868096",
              "VRAM Total Used Memory (B)": "297799680"},
    "system": {"Driver version": "6.10.5"}})
AMD_SMI_JSON = json.dumps([{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X"},
                            "vram": {"size": {"value": 196592, "unit": "MB"}}, "driver": {"version": "6.8.5"}}])
AMD_PROCS = json.dumps([{"gpu": 0, "process_list": [{"process_info": {"name": "python3", "pid": 77}}]}])
NPU_SMI = """+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc2                 Version: 24.1.rc2                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.5        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 91.2        39                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3162 / 65536         |
+===========================+===============+====================================================+
"""
# Atlas A3, 8 NPUs of two dies each (16 logical NPUs): vLLM-Ascend issue #2971's collect_env output, verbatim
# (tests/assets/vendor-tools/README.md).
NPU_SMI_A3 = (Path(__file__).parents[1] / "assets" / "vendor-tools" / "npu-smi-info-a3.txt").read_text()
# Process rows in npu-smi's `NPU Chip` layout, from vLLM-Ascend's tests/ut/device_allocator/test_cpu_binding.py.
NPU_PROCS = ("| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |\n"
             "| 0       0                 | 3428811       | python3.10               | 56600                   |\n"
             "| 1       0                 | 3428818       | python3.10               | 56474                   |\n")


def test_nvidia_smi_csv_apps_and_banner() -> None:
    inv = acc.nvidia([NVIDIA_CSV, NVIDIA_APPS, NVIDIA_BANNER])
    assert [g.name for g in inv.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert inv.gpus[1].memory_used_bytes == 40960 * 2**20 and inv.gpus[0].memory_total_bytes == 81559 * 2**20
    assert (inv.driver, inv.toolkit) == ("550.54.15", "12.4")
    assert inv.processes == ("pid 12345 (python3, 40950 MiB)",)
    with pytest.raises(acc.ParseError, match="expected 5 CSV fields"):
        acc.nvidia(["0, NVIDIA H100, 81559\n", "", ""])  # a query with other fields is not silently misread


def test_amd_and_ascend_tools() -> None:
    rocm = acc.rocm_smi([ROCM_JSON])
    assert len(rocm.gpus) == 2 and rocm.driver == "6.10.5" and rocm.gpus[0].memory_total_bytes == 309220868096
    amd = acc.amd_smi([AMD_SMI_JSON, AMD_PROCS])
    assert amd.gpus[0].name == "AMD Instinct MI300X" and amd.driver == "6.8.5" and amd.processes == ("pid 77 (python3)",)
    npu = acc.npu_smi([NPU_SMI])
    assert [g.name for g in npu.gpus] == ["910B3", "910B3"] and npu.driver == "24.1.rc2"
    assert npu.gpus[0].memory_total_bytes == 65536 * 2**20 and npu.gpus[1].memory_used_bytes == 3162 * 2**20


def test_npu_smi_on_an_a3_lists_each_die_as_a_logical_npu() -> None:
    """A3's chip rows carry a Phy-ID (`| 1     1  | 0000:9F:00.0 |`), which the A2 parser took for NPU rows."""
    a3 = acc.npu_smi([NPU_SMI_A3])
    assert [g.index for g in a3.gpus] == list(range(16)) and {g.name for g in a3.gpus} == {"Ascend910"}
    assert a3.driver == "24.1.rc3.7" and a3.processes == ()
    assert all(g.memory_total_bytes == 65536 * 2**20 for g in a3.gpus)
    assert a3.gpus[1].memory_used_bytes == 3196 * 2**20 and a3.gpus[15].memory_used_bytes == 3187 * 2**20
    assert acc.model_matches("ascend-a3", "Huawei Ascend 910C die (Atlas 800 A3) 64GB", a3.gpus[0].name)
    table = NPU_SMI_A3[:NPU_SMI_A3.index("| NPU     Chip")]
    busy = acc.npu_smi([table + NPU_PROCS])
    assert len(busy.gpus) == 16
    assert busy.processes == ("pid 3428811 (python3.10, 56600 MB)", "pid 3428818 (python3.10, 56474 MB)")
    with pytest.raises(acc.ParseError, match="no NPU rows"):
        acc.npu_smi([NPU_SMI_A3.replace("0000:", "xxxx:")])


@pytest.mark.parametrize(("cid", "name", "reported", "ok"), [
    ("h100-80gb", "NVIDIA H100 80GB HBM3 (SXM)", "NVIDIA H100 80GB HBM3", True),
    ("h200", "NVIDIA H200 141GB HBM3e (SXM)", "NVIDIA H100 80GB HBM3", False),
    ("mi355x", "AMD Instinct MI355X 288GB HBM3E", "AMD Instinct MI355X", True),
    ("ascend-a2", "Huawei Ascend 910B (Atlas 800 A2) 64GB", "910B3", True),
])
def test_model_matches(cid: str, name: str, reported: str, ok: bool) -> None:
    assert acc.model_matches(cid, name, reported) is ok


def test_agree_names_the_odd_node_and_what_the_others_have() -> None:
    got = agree({0: "550.54.15", 1: "550.90.07", 2: "550.54.15", 3: None}, "driver")
    assert got[0][0] == "pass" and 3 not in got
    assert got[1] == ("fail", "driver 550.90.07; the other nodes have 550.54.15",
                      "make driver the same on every node (550.54.15)")
    pinned = agree({0: "0.5.23", 1: "0.5.23"}, "version", expected="0.5.22")
    assert pinned[0][0] == "fail" and "expected 0.5.22" in pinned[0][1]


@pytest.mark.parametrize(("answer", "cause"), [
    ({"error": "RuntimeError: ... Unable to find address for: ens9"}, "names no usable interface"),
    ({"error": "RuntimeError: Gloo connectFullMesh failed with ... Connection refused"}, "could not connect the ranks"),
    ({"error": "no progress for 20 s (watchdog)", "timeout": True, "stage": "init_process_group"},
     "the group never formed at 10.0.0.1:29500"),
    ({"error": "ModuleNotFoundError: No module named 'torch'", "no_torch": True}, "has no torch"),
])
def test_diagnose(answer: dict[str, object], cause: str) -> None:
    assert cause in diagnose(answer, "10.0.0.1:29500")[0]


def _report(*statuses: str) -> Report:
    checks = tuple(CheckResult(name=f"c{i}", title="", asks="", verdicts=(
        Verdict(rank=0, host="h1", status="pass"),
        Verdict(rank=1, host="h2", status=s, detail=f"bad {i}", fix=f"fix {i}"))) for i, s in enumerate(statuses))
    return Report(name="d", checks=checks, elapsed_s=1.0)


def test_exit_codes_summary_json_and_junit(tmp_path: Path) -> None:
    assert _report("pass", "skip").exit_code == 0
    failed = _report("pass", "fail", "skip")
    assert failed.exit_code == 1 and failed.summary() == "c1: rank 1 (h2): bad 1; fix 1"
    assert _report("fail", "error").exit_code == 3  # a node that could not be asked outranks a failed check
    data = failed.as_json()
    assert data["exit_code"] == 1 and [c["status"] for c in data["checks"]] == ["pass", "fail", "pass"]
    write_junit(failed, tmp_path / "r.xml")
    from junitparser import JUnitXml

    xml = JUnitXml.fromfile(str(tmp_path / "r.xml"))
    cases = {(s.name, c.name): c for s in xml for c in s}
    assert cases[("preflight.c1", "rank 1 (h2)")].result[0].message == "bad 1"
    assert cases[("preflight.c2", "rank 1 (h2)")].is_skipped
    assert cases[("preflight.c0", "rank 0 (h1)")].is_passed
