"""`k3deploy weights sync`: the manifest's files to `model.path` on every node, fanned out node to node.

Before any byte moves: every node's copy is hashed (verified files are skipped: a rerun resumes), paths that
leave the checkpoint directory are refused, and every node's free space (statvfs) is held against what it
still needs. Then every node runs one process (started through its executor; weights_node's "chain") that
serves its directory over HTTP on its private IP and pulls the files it lacks in order, and the nodes form a
chain: the first pulls each file from the source (put by the executor from this machine, served by the source
node, or the hub's resolve URLs), each next node from the one before, which passes the bytes on while they
arrive (all but the last byte until it has verified the file), so the source's link carries each byte once and
the hops add no file's time. Each node's plan (its files, its feeders nearest first) is a file put beside its
log; its lines (progress, each file's result, a put it asks for) come back through `follow`. Nodes on one
storage (`shared_storage`) get one copy. Every file is written to a temporary name, its sha256 checked against
the manifest, then renamed. A corrupt source file, or a hub that fails the first node, stops the sync (what the
nodes had of that file is removed); a node lost mid-sync is named, the nodes after it pull from the nearest one
before it; a node whose disk fills stops, named, and the others finish."""
from __future__ import annotations

import json
import os
import posixpath
import shlex
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3deploy.checkpoint.manifest import Manifest
from k3deploy.errors import ExecError, InputError, K3Error
from k3deploy.executors.base import Executor, ProcessHandle
from k3deploy.executors.fleet import NODE_PYTHON, NodeFleet, probe_source
from k3deploy.launch.weights import BASE_TIMEOUT_S, NodeWeights, SharedStorage, hash_copies, shared_storage
from k3deploy.probes import weights_node

MIN_COPY_BYTES_PER_S = 10_000_000  # a file's transfer gets this rate at worst before the node is called hung
SERVE_START_S = 60.0
FOLLOW_LINES = 1_000_000  # a node's log from its start: no line missed however late the follow begins
NODE_CHECK_S = 30.0  # after a node's sync process ended early: how long the node may take to answer at all


class SyncError(K3Error):
    """A sync that must not go on: a node without room, a corrupt source file (exit 1)."""

    exit_code = 1


class DiskFull(SyncError):
    """A node's disk filled while a file was written there: that node stops (named, with its free and needed
    bytes), the others go on."""


class HubFailed(ExecError):
    """The hub did not give a file to the first node (it did not answer, or broke off): the sync stops (exit 3);
    no other node would fare better, and a rerun resumes."""


@dataclass(frozen=True)
class Source:
    """Where the files come from: a directory on this machine, or one served by a node (`rank` in the fleet)."""

    directory: str
    rank: int | None = None  # None: this machine
    ip: str = ""  # the source node's private IP, where its server listens
    url: str | None = None  # files at URL/NAME (the hub's resolve URL of a revision): the first node pulls them


@dataclass
class NodeSync:
    """What a sync did on one node."""

    host: str
    path: str
    skipped: int = 0  # files already verified there
    sent: int = 0
    bytes: int = 0
    error: str | None = None
    full: bool = False  # the error is its disk filling up (exit 1), not the node lost (exit 3)
    shared_with: str = ""  # host:path (fs) whose storage this node's directory is; "" its own
    log: str = ""  # its sync process's log there, kept when the node did not complete ("" removed, or none)

    def as_json(self) -> dict[str, Any]:
        """The node's line of `--json`."""
        return {"host": self.host, "path": self.path, "skipped": self.skipped, "sent": self.sent,
                "bytes": self.bytes, "error": self.error, "disk_full": self.full,
                "shared_with": self.shared_with or None, "log": self.log or None}


@dataclass
class SyncReport:
    """Every target node's outcome (rank -> NodeSync)."""

    nodes: dict[int, NodeSync] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 every node complete; 3 a node unreachable or lost; 1 a node's disk filled up (and none lost)."""
        if any(n.error and not n.full for n in self.nodes.values()):
            return 3
        return 1 if any(n.full for n in self.nodes.values()) else 0

    def as_json(self) -> dict[str, Any]:
        """The report for `--json`."""
        return {"exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3),
                "bytes": sum(n.bytes for n in self.nodes.values()),
                "nodes": [n.as_json() for _, n in sorted(self.nodes.items())]}


# (rank, file, bytes of that file done so far) while copying; (rank, file, -1) once it is verified at its final name
Progress = Callable[[int, str, int], None]


def _check_space(fleet: NodeFleet, copies: dict[int, NodeWeights], paths: dict[int, str]) -> None:
    free = fleet.run_probe(weights_node, ranks=list(copies),
                           args_for=lambda r: [json.dumps({"op": "space", "path": paths[r]})])
    for rank, copy in sorted(copies.items()):
        o = free[rank]
        if not o.ok:
            raise ExecError(f"cannot read the free space at {paths[rank]}: {o.error}", host=fleet.host(rank))
        answer: dict[str, Any] = o.value or {}
        room = int(answer["free"])
        if room < copy.bytes_to_go:
            raise SyncError(f"{fleet.host(rank)}: {room:,} bytes free at {answer['at']}, the checkpoint needs "
                            f"{copy.bytes_to_go:,} more there; nothing was copied",
                            hint=f"free {copy.bytes_to_go - room:,} bytes on {fleet.host(rank)} (or point "
                            "model.path at a larger disk) and rerun")


def _plan_file(log_path: str) -> str:
    """Where a node's plan is put: beside its process's log."""
    return f"{log_path}.plan.json"


def _start(ex: Executor, rank: str, spec: dict[str, Any], log_dir: str, run: str) -> tuple[ProcessHandle, str]:
    """A node's process (a server, or a server and its puller) started; its handle and its server's URL."""
    program, log = probe_source(weights_node), f"{log_dir}/k3weights-{run}-{rank}.log"
    if spec["op"] == "chain":
        spec = {**spec, "plan": _plan_file(log)}
    handle = ex.start(f"exec {NODE_PYTHON} -c {shlex.quote(program)} {shlex.quote(json.dumps(spec))}", log,
                      tag=f"k3weights.{run}.{rank}")
    deadline = time.monotonic() + SERVE_START_S
    while time.monotonic() < deadline:
        for line in ex.read_log(handle, 5).splitlines():
            if line.startswith('{"type": "serving"'):
                return handle, f"http://{spec['ip']}:{json.loads(line)['port']}"
        if not ex.alive(handle):
            break
        time.sleep(0.2)
    tail = ex.read_log(handle, 5).strip()[-300:]
    ex.terminate(handle, 2.0)
    raise ExecError(f"the checkpoint server did not start on {spec['ip']}: {tail or 'no output'}", host=ex.host)


def _stop_servers(fleet: NodeFleet, servers: dict[int, tuple[ProcessHandle, str]], source: Source) -> None:
    while servers:
        try:
            r, (handle, _) = servers.popitem()
        except KeyError:  # another thread stopped the last one
            return
        try:
            fleet.executor(source.rank if r == -1 and source.rank is not None else r).terminate(handle, 2.0)
        except ExecError:
            pass


def _put_file(ex: Executor, local: str, remote: str) -> None:
    """`local` put at `remote`, whole: under a name of its own first, then moved there."""
    ex.put(local, f"{remote}.up")
    res = ex.run(["mv", "-f", f"{remote}.up", remote], 60.0)
    if not res.ok:
        raise ExecError(f"cannot move the put file to {remote}: {res.stderr.strip()}", host=ex.host)


@dataclass
class _Run:
    """One sync's shared state: the report, and what stops it (a corrupt source file, the hub failing)."""

    report: SyncReport
    manifest: Manifest
    source: Source
    paths: dict[int, str]
    progress: Progress | None
    servers: dict[int, tuple[ProcessHandle, str]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    fatal: K3Error | None = None
    bad: str = ""  # the file whose source copy is corrupt: its partial copies are removed everywhere

    def abort(self, fleet: NodeFleet, exc: K3Error, name: str = "") -> None:
        """Stop every node at once: a sync that must not go on."""
        if self.fatal is None:
            self.fatal, self.bad = exc, name
        self.stop.set()
        _stop_servers(fleet, self.servers, self.source)

    def file_done(self, fleet: NodeFleet, rank: int, ex: Executor, msg: dict[str, Any], todo: list[str]) -> None:
        """One file's result line from a node."""
        name, node, path = msg["name"], self.report.nodes[rank], self.paths[rank]
        want = self.manifest.files[name]
        if msg.get("ok"):
            node.sent += 1
            node.bytes += int(msg.get("bytes", 0))
            if self.progress is not None:
                self.progress(rank, name, -1)
        elif msg.get("full"):  # this node stops, named with its free and needed bytes; the others go on
            need = sum(self.manifest.files[n].size for n in todo[todo.index(name):])
            full = DiskFull(f"{ex.host}: the disk at {path} filled up while {name} ({want.size:,} bytes) was "
                            f"written: {int(msg['free']):,} bytes free; its partial file was removed, nothing of it "
                            "kept at its name")
            node.error, node.full = f"{full} ({need:,} bytes still needed there)", True
        elif msg.get("skipped"):
            pass
        elif msg.get("corrupt") and msg.get("source") and not msg.get("upstream"):
            self.abort(fleet, SyncError(
                f"source file {posixpath.join(self.source.directory, name)} is corrupt, refused at {ex.host}: "
                f"{msg['error']}; nothing of it was kept",
                hint="replace that file in the source (or download it again) and rerun"), name)
        elif msg.get("source") and self.source.url is not None and not msg.get("upstream"):
            try:
                _hub_failed(msg, self.source.url, name, ex.host)
            except (HubFailed, InputError) as exc:  # the hub failed a node: no other would do better
                self.abort(fleet, exc)
        elif node.error is None:
            node.error = str(ExecError(f"copying {name} to {path} failed: {msg.get('error')}", host=ex.host))

    def node(self, fleet: NodeFleet, rank: int, ex: Executor, plan: dict[str, Any]) -> None:
        """One node's files: its plan put there, its lines followed until it has settled every file."""
        handle, todo = self.servers[rank][0], [f["name"] for f in plan["files"]]
        left = set(todo)
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(plan, f)
            try:
                ex.put(f.name, _plan_file(handle.log_path))
            finally:
                os.unlink(f.name)
            for line in ex.follow(handle, FOLLOW_LINES, self.stop):
                if not line.startswith('{"type": '):
                    continue
                msg = json.loads(line)
                if msg["type"] == "progress" and self.progress is not None:
                    self.progress(rank, msg["name"], int(msg["done"]))
                elif msg["type"] == "want":
                    _put_file(ex, str(Path(self.source.directory) / msg["name"]),
                              weights_node.put_name(self.paths[rank], msg["name"]))
                elif msg["type"] == "file":
                    left.discard(msg["name"])
                    self.file_done(fleet, rank, ex, msg, todo)
                elif msg["type"] == "done":
                    return
        except ExecError as exc:  # the node is lost: named; the nodes after it pull from before it
            self.report.nodes[rank].error = str(exc)
            return
        if left and not self.stop.is_set() and self.report.nodes[rank].error is None:
            ended = f"the sync's process at {self.paths[rank]} ended with {len(left)} files to go"
            try:  # the node itself gone (a host crash) is the cause to name, in the executor's words
                ex.run("true", NODE_CHECK_S)
            except ExecError as exc:
                self.report.nodes[rank].error = f"{exc} ({ended})"
                return
            self.report.nodes[rank].error = str(ExecError(ended, host=ex.host))


def sync(fleet: NodeFleet, targets: dict[int, tuple[str, str]], manifest: Manifest, source: Source, *,
         log_dir: str, progress: Progress | None = None, shared: SharedStorage | None = None) -> SyncReport:
    """Make every target rank's directory (rank -> (private ip, path)) hold exactly the manifest's files (its
    paths checked: `Manifest.check_paths`): one copy per storage (`shared`, else `shared_storage` asks the nodes),
    the other nodes on it reported shared with it."""
    t0 = time.monotonic()
    paths = {r: p for r, (_, p) in targets.items()}
    names = sorted(manifest.files)
    if source.rank is None and source.url is None:
        for name in names:
            local = Path(source.directory) / name
            if not local.is_file():
                raise InputError(f"--from {source.directory}: no {name} there (the manifest lists it)",
                                 hint="point --from at the checkpoint directory the manifest was made from")
    storage = shared if shared is not None else shared_storage(fleet, list(targets), paths)
    report = SyncReport()
    for rank in targets:
        report.nodes[rank] = NodeSync(fleet.host(rank), paths[rank])
    copies = hash_copies(fleet, storage.owners, paths, manifest)
    live: dict[int, NodeWeights] = {}
    for rank, copy in sorted(copies.items()):
        if isinstance(copy, str):
            report.nodes[rank].error = copy
        else:
            live[rank] = copy
            report.nodes[rank].skipped = len(copy.verified)
    _check_space(fleet, live, paths)
    run = uuid.uuid4().hex[:8]
    state = _Run(report, manifest, source, paths, progress)
    servers = state.servers
    logs: dict[int, str] = {}  # each started process's log (rank -1: the source node's server)
    try:
        stall_s = BASE_TIMEOUT_S + max((d.size for d in manifest.files.values()), default=0) / MIN_COPY_BYTES_PER_S
        started = fleet.map(lambda r, ex: _start(ex, f"{r}", {
            "op": "chain", "path": paths[r], "ip": targets[r][0], "stall_s": stall_s}, log_dir, run), list(live),
            in_pool=True)
        for r, o in started.items():
            if not o.ok:  # a node that cannot serve is lost for this run: named, the others go on
                report.nodes[r].error = str(o.error)
            else:
                assert o.value is not None
                servers[r] = o.value
        src_feeder = source.url or "put"
        if source.rank is not None:
            src = _start(fleet.executor(source.rank), "source", {"op": "serve", "path": source.directory,
                                                                   "ip": source.ip}, log_dir, run)
            servers[-1] = src
            src_feeder = src[1]
        chain = sorted(r for r in servers if r >= 0)
        logs.update({r: handle.log_path for r, (handle, _) in servers.items()})
        plans = {}
        for i, r in enumerate(chain):  # each node pulls from the nearest one before it that has the file
            verified = set(live[r].verified)
            if progress is not None:
                for name in sorted(verified):
                    progress(r, name, -1)
            plans[r] = {"files": [{"name": n, "size": manifest.files[n].size, "sha256": manifest.files[n].sha256}
                                  for n in names if n not in verified],
                        "feeders": [servers[b][1] for b in reversed(chain[:i])] + [src_feeder]}
        try:
            fleet.map(lambda r, ex: state.node(fleet, r, ex, plans[r]), chain, in_pool=True)
        except BaseException:  # interrupted (Ctrl-C, `kill`): every node stops at once; partial files are kept
            state.stop.set()
            _stop_servers(fleet, servers, source)
            raise
    finally:
        _stop_servers(fleet, servers, source)
    if state.fatal is not None:
        if state.bad:  # what the nodes after the first had of it (never at its final name) goes too
            fleet.map(lambda r, ex: ex.run(["rm", "-f", weights_node.temp_name(paths[r], state.bad)], 60.0),
                      list(live), in_pool=True)
        raise state.fatal
    _drop_logs(fleet, report, logs)
    for rank, owner in storage.owner.items():  # one storage: the owner's copy is theirs, nothing was sent to them
        if owner != rank:
            n = report.nodes[rank]
            n.shared_with = f"{fleet.host(owner)}:{paths[owner]} ({storage.fs[rank]})"
            n.error, n.full = report.nodes[owner].error, report.nodes[owner].full
    report.elapsed_s = time.monotonic() - t0
    return report


def _drop_logs(fleet: NodeFleet, report: SyncReport, logs: dict[int, str]) -> None:
    """Each node's process log (and its plan beside it) removed where its sync completed (the source node's where
    every node's did); kept where it did not, and named in its report."""
    failed = [r for r in logs if r >= 0 and report.nodes[r].error is not None]
    for r in failed:
        report.nodes[r].log = logs[r]
    done = [r for r in logs if r not in failed and (r >= 0 or not failed)]
    fleet.map(lambda r, ex: ex.run(["rm", "-f", logs[r], _plan_file(logs[r])], 60.0), done, in_pool=True)


def _hub_failed(out: dict[str, Any], url: str, name: str, host: str) -> None:
    """A hub fetch that failed on the first node, as the sync's error: a repo, revision or file the hub lacks or
    withholds (401/403/404) is input (exit 2), anything else the hub not answering (exit 3, naming it)."""
    if out.get("status") in (401, 403, 404):
        raise InputError(f"--from hub: {url} lacks {name}, or withholds it ({out.get('error')})",
                         hint="check model.revision and the manifest (k3deploy manifest from-hub REPO --revision SHA); "
                         "a gated repo needs --staging DIR with HF_TOKEN or `hf auth login` here (no token goes "
                         "to the nodes)")
    parts = urllib.parse.urlsplit(url)
    raise HubFailed(f"the hub did not give {name} to {host}: {out.get('error')}",
                    host=f"{parts.scheme}://{parts.netloc}",
                    hint="check that the first node reaches the hub (proxy, HF_ENDPOINT for a mirror), then rerun "
                    "(verified and partial files are kept); or --staging DIR to download here first")


def run_sync(log_dir: str, nodes: dict[tuple[str, str], list[Any]], manifest: Manifest, source: Source,
             source_target: Any, quiet: bool) -> SyncReport:
    """The CLI's sync: one target per host and path (every instance's nodes), rich progress per node and in
    total (bytes, rate, ETA) unless `quiet`; each node's outcome printed."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    keys = list(nodes)
    targets = {i: (nodes[k][0].ip, k[1]) for i, k in enumerate(keys)}
    fleet_targets = {i: nodes[k][0].target for i, k in enumerate(keys)}
    if source_target is not None:
        fleet_targets[-1] = source_target
    console = Console(stderr=True, highlight=False)
    need = sum(d.size for d in manifest.files.values())
    bars = Progress("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=console, disable=quiet)
    with NodeFleet(fleet_targets) as fleet, bars:
        shared = shared_storage(fleet, list(targets), {r: p for r, (_, p) in targets.items()})
        total = bars.add_task("total", total=need * len(shared.owners))
        per = {r: bars.add_task(fleet.host(r), total=need) for r in shared.owners}
        seen: dict[tuple[int, str], int] = {}
        lock = threading.Lock()

        def tick(rank: int, name: str, done: int) -> None:
            with lock:
                now = manifest.files[name].size if done < 0 else done
                step = now - seen.get((rank, name), 0)
                seen[(rank, name)] = now
                bars.advance(per[rank], step)
                bars.advance(total, step)

        report = sync(fleet, targets, manifest, source, log_dir=log_dir, progress=tick, shared=shared)
    if not quiet:
        for n in report.nodes.values():
            fix = "free space there (or point model.path at a larger disk), then rerun" if n.full else \
                "rerun to complete it"
            log = f"; its log: {n.log}" if n.log else ""
            what = f"error: {n.error} ({fix}{log})" if n.error else \
                f"the same storage as {n.shared_with}: synced there" if n.shared_with else \
                f"{n.sent} files, {n.bytes:,} bytes copied, {n.skipped} already verified"
            console.print(f"{n.host}:{n.path}: {what}")
    return report
