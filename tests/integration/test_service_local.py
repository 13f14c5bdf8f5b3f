"""Two replicas x 2 local nodes of the stand-in (SGLang mimic) behind the real smg 1.13.0, launched by one
`k3deploy launch`: status shows both healthy in the router's /workers, requests through the router are served
by both (smg names the worker: x-smg-routed-worker-id); a replica's node killed is restarted within the budget;
killed again with the budget spent it stays down, is named, and the router sends it nothing; the router killed
is named; stop leaves no process."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from k3deploy.records.store import StateStore
from tests.integration.replica_faults import restart_replica, with_fault
from tests.integration.test_router_tables import VENV, needs_routers
from tests.k3deploy_cli import k3deploy_argv
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.ports import closed_port

pytestmark = [pytest.mark.integration, needs_routers]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS_ENV = "K3_UPDATE_SCREENSHOTS"  # set: the tests that show a view write its picture under docs/screenshots


def _topology(tmp: Path, checkpoint: Path, backoff_s: float = 1) -> tuple[Path, int]:
    """Two replicas behind smg; one restart each (after `backoff_s`)."""
    doc = yaml.safe_load((ROOT / "tests/assets/replicas/local-2x2-smg.yaml").read_text())
    port, engine, rdzv = closed_port(), closed_port(), closed_port()
    doc["model"]["path"] = str(checkpoint)
    doc["name"] = f"svc-{uuid.uuid4().hex[:6]}"
    doc["engine"]["port"] = engine
    doc["router"] = {"kind": "smg", "port": port, "metrics_port": closed_port(), "python": str(VENV / "bin/python"),
                     "health_check_interval_s": 1, "health_failure_threshold": 2, "health_success_threshold": 1}
    doc["launch"].update({"port": rdzv, "stop_grace_s": 3, "log_dir": str(tmp / "logs"),
                          "state_dir": str(tmp / "state"), "restart": {"max": 1, "backoff_s": backoff_s}})
    path = tmp / "svc.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, port


def _served_by(port: int, n: int) -> list[str]:
    out = []
    for i in range(n):
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
            "model": "kimi-k3-tiny", "prompt": f"{uuid.uuid4().hex} {i}", "max_tokens": 1})
        assert r.status_code == 200, r.text
        out.append(r.headers["x-smg-routed-worker-id"])
    return out


def _status(topo: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    run = cli("status", str(topo), "--json")
    return run.returncode, json.loads(run.stdout)


def _pids(store: StateStore, names: list[str]) -> list[int]:
    pids = []
    for name in names:
        rec = store.load(name)
        pids += [n.handle.pid for n in rec.nodes if n.handle] if rec else []
        if rec and rec.owner:
            pids.append(rec.owner.pid)
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.timeout(600)
def test_two_replicas_behind_smg_launch_status_faults_stop(tmp_path: Path, checkpoint: Path) -> None:
    topo, port = _topology(tmp_path, checkpoint)
    name = yaml.safe_load(topo.read_text())["name"]
    store = StateStore(tmp_path / "state")
    parts = [f"{name}-r0", f"{name}-r1", f"{name}-router"]
    try:
        run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=400)
        assert run.returncode == 0, run.stderr
        svc = json.loads(run.stdout)
        assert svc["preflight"] == "skipped", svc
        assert svc["status"] == "ready" and [r["phase"] for r in svc["replicas"]] == ["ready", "ready"]
        code, st = _status(topo)
        assert code == 0 and st["status"] == "ready", st
        assert [r["router_healthy"] for r in st["replicas"]] == [True, True], st
        urls = {r["url"] for r in st["replicas"]}
        assert set(_served_by(port, 16)) == urls  # both replicas serve requests through the router

        # A replica's node killed while serving: restarted within the budget (max 1), both serve again.
        os.kill(store.require(f"{name}-r0").nodes[1].handle.pid, signal.SIGKILL)  # type: ignore[union-attr]
        assert wait_for(lambda: len(store.require(f"{name}-r0").attempts) == 2
                        and _status(topo)[1]["status"] == "ready", 180), _status(topo)
        assert wait_for(lambda: set(_served_by(port, 8)) == urls, 60)

        # Killed again with the budget spent: it stays down, named, and the router stops sending to it.
        os.kill(store.require(f"{name}-r0").nodes[1].handle.pid, signal.SIGKILL)  # type: ignore[union-attr]
        assert wait_for(lambda: store.require(f"{name}-r0").status == "failed", 120), store.require(f"{name}-r0")
        assert wait_for(lambda: _status(topo)[1]["replicas"][0]["router_healthy"] is False, 60), _status(topo)
        code, st = _status(topo)
        assert st["status"] == "degraded" and code == 0, st
        assert st["replicas"][0]["problem"] != "" and st["replicas"][1]["problem"] == "", st
        assert f"{name}-r0" in cli("status", str(topo)).stdout
        assert set(_served_by(port, 6)) == {st["replicas"][1]["url"]}
        assert store.require(f"{name}-r0").status == "failed"  # held down for the whole check

        # The router killed (its process, not the shell that waits for it): named; restarted by its supervisor.
        router = store.require(f"{name}-router")
        child = _engine_of(router.nodes[0].handle.pid)  # type: ignore[union-attr]
        assert child is not None, "the router's process"
        os.kill(child, signal.SIGKILL)
        assert wait_for(lambda: "router" in _status(topo)[1]["router_problem"]
                        or len(store.require(f"{name}-router").attempts) == 2, 30), _status(topo)
    finally:
        pids = _pids(store, parts)
        stop = cli("stop", str(topo), timeout_s=120)
    assert stop.returncode == 0, stop.stderr
    assert f"{name}: stopped" in stop.stdout
    assert wait_for(lambda: not any(_alive(p) for p in pids), 20), [p for p in pids if _alive(p)]
    assert not any(_alive(p) for p in _pids(store, parts))
    assert _status(topo)[1]["status"] == "stopped"


@pytest.mark.timeout(300)
def test_launch_checks_the_router_machine_before_any_replica_starts(tmp_path: Path, checkpoint: Path) -> None:
    """The router's port held here: launch stops before any replica (no record, no process) naming the port
    and its holder; the router's own interpreter finds smg. Freed, the router's checks pass and launch goes on
    to each replica's own preflight (no checkpoint there: each fails, and nothing serves)."""
    topo, port = _topology(tmp_path, checkpoint)
    name = yaml.safe_load(topo.read_text())["name"]
    store = StateStore(tmp_path / "state")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        run = cli("launch", str(topo), "--json", timeout_s=200)
    assert run.returncode == 4, run.stderr
    assert f"router-port: rank 0 (localhost): cannot listen on 127.0.0.1:{port}: Address already in use" in run.stderr
    assert "router-python" not in run.stderr, run.stderr  # smg's venv has it
    svc = json.loads(run.stdout)
    assert (svc["status"], svc["preflight"]) == ("failed", "failed") and "router-port" in svc["cause"], svc
    assert not [p.name for p in store.directory.iterdir() if p.suffix == ".json"]  # no replica, no router record

    doc = yaml.safe_load(topo.read_text())
    doc["model"]["path"] = str(tmp_path / "no-checkpoint")
    topo.write_text(yaml.safe_dump(doc))
    run = cli("launch", str(topo), "--json", timeout_s=200)
    assert run.returncode == 4 and "no replica became ready" in run.stderr, run.stderr
    svc = json.loads(run.stdout)
    assert svc["preflight"] == "passed" and all("checkpoint" in r["cause"] for r in svc["replicas"]), svc
    assert [store.require(f"{name}-r{i}").preflight for i in (0, 1)] == ["failed", "failed"]


def _engine_of(leader: int) -> int | None:
    """The first process under a node's wrapper that is no shell (the shells between wait for it)."""
    todo = [leader]
    while todo:
        kids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) in todo]
        for pid in kids:
            try:
                if os.path.basename(os.readlink(f"/proc/{pid}/exe")) not in ("sh", "dash", "bash"):
                    return pid
            except OSError:
                continue
        todo = kids
    return None


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout


def _load(port: int, stop: threading.Event) -> None:
    """Requests through the router until `stop`: long enough answers that each replica's TPOT is measured."""
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                client.post(f"http://127.0.0.1:{port}/v1/completions", json={
                    "model": "kimi-k3-tiny", "prompt": uuid.uuid4().hex, "max_tokens": 24, "ignore_eos": True})
            except httpx.HTTPError:
                stop.wait(0.2)  # a replica restarting: the router may refuse a request meanwhile


@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_top_in_tmux_shows_both_replicas_and_names_the_slowed_one(tmp_path: Path, checkpoint: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`k3deploy top` as a person sees it in a terminal: both replicas' live figures beside the prediction;
    one replica restarted with slow_decode is named as lagging within two refreshes of its first window; and
    `--once --json` carries the same figures."""
    topo, port = _topology(tmp_path, checkpoint)
    name = yaml.safe_load(topo.read_text())["name"]
    store = StateStore(tmp_path / "state")
    parts = [f"{name}-r0", f"{name}-r1", f"{name}-router"]
    sock, stops = f"k3top-{uuid.uuid4().hex[:8]}", [threading.Event()]
    screen = tmp_path / "screen.txt"

    def load() -> list[threading.Thread]:
        """Four request loops through the router, until the newest `stops` event is set."""
        loaders = [threading.Thread(target=_load, args=(port, stops[-1]), daemon=True) for _ in range(4)]
        for t in loaders:
            t.start()
        return loaders

    try:
        run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=400)
        assert run.returncode == 0, run.stderr
        loaders = load()
        cmd = shlex.join(k3deploy_argv("top", topo, "--interval", "1", "--window", "4"))
        _tmux(sock, "new-session", "-d", "-x", "200", "-y", "40", "-c", str(ROOT), cmd)

        def pane() -> str:
            text = _tmux(sock, "capture-pane", "-p", "-J")
            screen.write_text(text)
            return text

        def both_live(text: str) -> bool:
            """Each replica's row has every figure, and the prediction's row follows it."""
            lines = text.splitlines()
            at = [next((i for i, ln in enumerate(lines) if ln.startswith(f"│ {p} ")), -1) for p in parts[:2]]
            return all(i >= 0 and " - " not in lines[i] and lines[i + 1].startswith("│   predicted") for i in at)

        assert wait_for(lambda: both_live(pane()), 60), screen.read_text()
        text = screen.read_text()
        assert "predicted for" in text and "router" in text and "LAGS" not in text, text

        run = cli("top", str(topo), "--once", "--json", "--interval", "2")
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        live = {r["label"]: r for r in report["rows"]}
        assert all(live[p]["tpot_ms"] and live[p]["predicted"]["tpot_ms"] > 0 for p in parts[:2]), report

        # Replica 1 restarted with every decode step 10x slower: the view names it, against the other replica.
        # The load pauses while it is down: requests the router sent to it then would count as its failures, and
        # smg's circuit breaker (10 failures) keeps a worker out for --cb-timeout-duration-secs (60 s by default).
        stops[-1].set()
        for t in loaders:
            t.join(timeout=70)
        restart_replica(with_fault(topo, "slow_decode"), 1, store)
        stops.append(threading.Event())
        loaders = load()
        back = time.monotonic()
        assert wait_for(lambda: "waiting for a second scrape" not in pane()
                        and f"{name}-r1 LAGS" in screen.read_text(), 60), screen.read_text()
        lag = next(ln for ln in screen.read_text().splitlines() if "LAGS" in ln)
        with capsys.disabled():  # refreshes are 1 s apart; its first window needs two scrapes after it is back
            print(f"\ntop named the slowed replica {time.monotonic() - back:.1f} s after it was back")
        assert "TPOT" in lag and "the others'" in lag and f"{name}-r0 LAGS" not in screen.read_text(), lag
        if os.environ.get(SCREENSHOTS_ENV):  # the README's picture of `top`, from this run
            shot = screen.read_text().replace(name, "svc-readme")  # the same width as the random name
            (ROOT / "docs/screenshots/top.txt").write_text(shot.rstrip() + "\n")
        run = cli("top", str(topo), "--once", "--json", "--interval", "2")
        rows_json = {r["label"]: r for r in json.loads(run.stdout)["rows"]}
        assert "TPOT" in rows_json[f"{name}-r1"]["lag"] and not rows_json[f"{name}-r0"]["lag"], rows_json
    finally:
        for ev in stops:
            ev.set()
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, check=False, timeout=30)
        pids = _pids(store, parts)
        stopped = cli("stop", str(topo), timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr
    assert wait_for(lambda: not any(_alive(p) for p in pids), 20), [p for p in pids if _alive(p)]

