"""The calibration fit (planning/calibration), its storage beside the records (records/calibration) and the
`calibrate` command's refusals; `plan --workload` of a topology whose name has a calibration applies it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from k3deploy.errors import StateError
from k3deploy.planning.calibration import Calibration, Figure, fit
from k3deploy.records import calibration as stored
from tests.k3deploy_cli import run_k3deploy

pytestmark = pytest.mark.timeout(60)
DEMO = Path("topologies/local-demo.yaml")


def test_a_cluster_twice_as_slow_fits_factors_of_two_and_no_error() -> None:
    runs = [[Figure("tpot", 2 * 3.0, 3.0, 0.0), Figure("ttft", 2 * 0.5 + 3 * 40.0, 0.5, 40.0)],
            [Figure("tpot", 2 * 5.0 + 3 * 1.0, 5.0, 1.0), Figure("ttft", 2 * 2.0 + 3 * 90.0, 2.0, 90.0)]]
    result = fit(runs)
    assert (result.decode_factor, result.prefill_factor) == (pytest.approx(2), pytest.approx(3))
    assert result.error_after == pytest.approx(0, abs=1e-9) and result.error_before > 0.5
    assert (result.runs, result.figures, result.exact) == (2, 4, False)


def test_a_figure_only_the_decode_explains_fits_the_decode_and_keeps_the_prefill() -> None:
    result = fit([[Figure("tpot", 7.5, 3.0, 0.0)]])
    assert result.decode_factor == pytest.approx(2.5) and result.prefill_factor == 1.0
    assert "prefill factor kept at 1" in result.note and result.exact


def test_a_fit_with_no_figure_to_spare_keeps_the_catalogs_width() -> None:
    from k3deploy.planning.perf_band import Band

    exact = Calibration("d", 2.0, 1.0, 1, 1, 0.0, True, 0.0).band(Band("derived", 0.1, "x"))
    assert exact.kind == "calibrated" and exact.rel == 0.1 and "1 point, fitted exactly" in exact.why
    fitted = Calibration("d", 2.0, 1.0, 2, 4, 0.04, False, 0.0).band(None)
    assert (fitted.rel, fitted.why.split(";")[0]) == (0.04, "calibrated on this cluster (d): 2 points, error 4%")


def test_storage_keeps_one_run_per_workload_and_refuses_a_damaged_file(tmp_path: Path) -> None:
    run = {"workload": {"concurrency": 2, "input_tokens": 10, "output_tokens": 5}, "plan_digest": "a"}
    stored.add_measurement(tmp_path, "d", {**run, "at": 1})
    assert stored.add_measurement(tmp_path, "d", {**run, "at": 2}) == [{**run, "at": 2}]
    assert stored.load_calibration(tmp_path, "d") is None
    cal = Calibration("d", 2.0, 1.5, 1, 2, 0.0, True, 0.0)
    stored.save_calibration(tmp_path, "d", {"calibration": cal.as_json()})
    assert stored.load_calibration(tmp_path, "d") == cal
    assert stored.calibration_path(tmp_path, "d").stat().st_mode & 0o777 == 0o600
    stored.calibration_path(tmp_path, "d").write_text("{")
    with pytest.raises(StateError, match=r"calibration.json is not JSON"):
        stored.load_calibration(tmp_path, "d")
    assert stored.remove_calibration(tmp_path, "d") and not stored.remove_calibration(tmp_path, "d")


def test_calibrate_refuses_without_measurements_and_with_both_show_and_remove(tmp_path: Path) -> None:
    none = run_k3deploy("calibrate", str(DEMO), "--state-dir", str(tmp_path))
    assert none.returncode == 5 and "run `k3deploy validate k3-local-demo --only effort` first" in none.stderr
    assert "Traceback" not in none.stderr
    shown = run_k3deploy("calibrate", "k3-local-demo", "--state-dir", str(tmp_path), "--show")
    assert shown.returncode == 5 and "has no calibration" in shown.stderr
    both = run_k3deploy("calibrate", "x", "--show", "--remove")
    assert both.returncode == 2 and "pick one" in both.stderr


def test_plan_applies_the_calibration_of_its_topologys_name_and_only_then(tmp_path: Path) -> None:
    doc = yaml.safe_load(DEMO.read_text())
    doc["launch"]["state_dir"] = str(tmp_path)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec = ("--workload", "in=1024,out=128,concurrency=4", "--json")
    plain = json.loads(run_k3deploy("plan", str(path), *spec).stdout)["prediction"]
    assert "calibration" not in plain
    # Both factors alike: every time doubles (one alone would also move the batch the stand-in's staggered
    # requests see: planning/prediction.py).
    cal = Calibration("k3-local-demo", 2.0, 2.0, 2, 4, 0.05, False, 0.0)
    stored.save_calibration(tmp_path, "k3-local-demo", {"calibration": cal.as_json()})
    got = json.loads(run_k3deploy("plan", str(path), *spec).stdout)["prediction"]
    assert got["calibration"]["decode_factor"] == 2.0
    assert got["mean_tpot_ms"] == pytest.approx(2 * plain["mean_tpot_ms"])
    assert got["mean_ttft_ms"] == pytest.approx(2 * plain["mean_ttft_ms"])
    assert got["band"]["kind"] == "calibrated" and got["band"]["rel"] == 0.05
    assert got["band"]["why"].startswith("calibrated on this cluster (k3-local-demo): 2 points, error 5%")


def test_validate_keeps_the_effort_run_and_calibrate_fits_and_prints_it(tmp_path: Path) -> None:
    """Cold runs measured as a cluster decoding at half and prefilling at a third of the catalog's pace would run
    them, kept as validate keeps them: `calibrate FILE` fits decode x2 and prefill x3 and prints both runs' errors
    before and after."""
    from k3deploy.catalog.loader import load_catalog
    from k3deploy.planning.prediction import predict_topology
    from k3deploy.planning.workload import Workload
    from k3deploy.records.locate import load_topology_file
    from k3deploy.validate.calibration import keep_effort
    from k3deploy.validate.pipeline import Report
    from k3deploy.validate.stage import StageResult

    doc = yaml.safe_load(DEMO.read_text())
    doc["launch"]["state_dir"] = str(tmp_path)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    t = load_topology_file(path)
    slow = Calibration("slow", 2.0, 3.0, 0, 0, 0.0, True, 0.0)
    for w in (Workload(4096, 64, 2, num_prompts=4), Workload(8192, 128, 4, num_prompts=8)):
        f = predict_topology(t, load_catalog(), w).bench_fields()
        m = predict_topology(t, load_catalog(), w, slow).bench_fields()
        cold = {**{k: m[k] for k in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")}, "completed": w.prompts}
        stage = StageResult(name="effort", status="pass", detail="", results={
            "cold": cold, "predicted": {"workload": w.model_dump(), "mean_tpot_ms": f["mean_tpot_ms"]}})
        dep = type("Dep", (), {"name": t.name, "plan_digest": "d1"})()
        keep_effort(tmp_path, dep, Report(deployment=t.name, passed=True, exit_code=0, stages=[stage]))  # type: ignore[arg-type]
    assert len(stored.load_measurements(tmp_path, t.name)) == 2
    run = run_k3deploy("calibrate", str(path))
    assert run.returncode == 0, run.stderr
    assert "decode factor x2, prefill factor x3 (both factors fitted by least squares)" in run.stdout
    assert "c2 4,096 / 64" in run.stdout and "TPOT*" in run.stdout and "-49%" in run.stdout and "+0%" in run.stdout
    assert "band: calibrated on this cluster (k3-local-demo): 2 points, error 0%" in run.stdout
    shown = json.loads(run_k3deploy("calibrate", str(path), "--show", "--json").stdout)
    assert shown["calibration"]["runs"] == 2 and shown["calibration"]["figures"] == 4


@pytest.mark.parametrize("file", ["pd-h200-1p1d-sglang.yaml", "replicas-h200-2x2x8-smg.yaml"])
def test_calibrating_a_service_says_it_is_not_supported_and_how_to_calibrate_one_instance(tmp_path: Path,
                                                                                           file: str) -> None:
    run = run_k3deploy("calibrate", str(Path("topologies") / file), "--state-dir", str(tmp_path))
    assert run.returncode == 2 and "calibrating a service is not supported" in run.stderr, run.stderr
    assert "no roles, replicas 1" in run.stderr and "Traceback" not in run.stderr
