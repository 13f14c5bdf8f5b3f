"""`k3deploy weights sync`: the manifest's files to `model.path` on every node, fanned out node to node.

Before any byte moves: every node's copy is hashed (verified files are skipped: a rerun resumes), paths that
leave the checkpoint directory are refused, and every node's free space (statvfs) is held against what it
still needs. Then every node serves its directory over HTTP on its private IP (started through its executor)
and the nodes form a chain: the first pulls each file from the source (put by the executor from this machine,
served by the source node, or the hub's resolve URLs), each next node pulls it from the one before once that one
has verified it, so the source's link carries each byte once and the chain is pipelined file by file. Nodes on
one storage (`shared_storage`) get one copy. Every file is written to a temporary name, its sha256 checked
against the manifest, then renamed. A corrupt source file, or a hub that fails the first node, stops the sync;
a node lost mid-sync is named, the nodes after it pull from the nearest one before it; a node whose disk fills
stops, named, and the others finish."""
from __future__ import annotations

import json
import posixpath
import shlex
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
from k3deploy.executors.fleet import NODE_PYTHON, NodeFleet, ProbeError, parse_probe_output, probe_source
from k3deploy.launch.weights import BASE_TIMEOUT_S, NodeWeights, SharedStorage, hash_copies, shared_storage
from k3deploy.probes import weights_node

MIN_COPY_BYTES_PER_S = 10_000_000  # a file's transfer gets this rate at worst before the node is called hung
SERVE_START_S = 60.0


class SyncError(K3Error):
    """A sync that must not go on: a node without room, a corrupt source file (exit 1)."""

    exit_code = 1


class DiskFull(SyncError):
    """A node's disk filled while a file was written there: that node stops (named, with its free and needed
    bytes), the others go on."""


class FeederFailed(ExecError):
    """The node a file was pulled from did not give it (its server gone with it, lost mid-sync): the puller is fine
    and takes the file from the node before that one, or the source."""


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

    def as_json(self) -> dict[str, Any]:
        """The node's line of `--json`."""
        return {"host": self.host, "path": self.path, "skipped": self.skipped, "sent": self.sent,
                "bytes": self.bytes, "error": self.error, "disk_full": self.full,
                "shared_with": self.shared_with or None}


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


def check_paths(manifest: Manifest, where: str) -> None:
    """Refuse manifest paths that would leave the checkpoint directory."""
    for name in manifest.files:
        norm = posixpath.normpath(name)
        if name.startswith("/") or norm == "." or norm.startswith("../") or norm == ".." or "\\" in name:
            raise InputError(f"{where}: file {name!r} leaves the checkpoint directory",
                             hint="a manifest lists paths relative to the checkpoint; make it again with "
                             "`k3deploy manifest create DIR`")


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


def _serve(ex: Executor, rank: str, path: str, ip: str, log_dir: str, run: str) -> tuple[ProcessHandle, str]:
    program = probe_source(weights_node)
    spec = json.dumps({"op": "serve", "path": path, "ip": ip})
    handle = ex.start(f"exec {NODE_PYTHON} -c {shlex.quote(program)} {shlex.quote(spec)}",
                      f"{log_dir}/k3weights-{run}-{rank}.log", tag=f"k3weights.{run}.{rank}")
    deadline = time.monotonic() + SERVE_START_S
    while time.monotonic() < deadline:
        for line in ex.read_log(handle, 5).splitlines():
            if line.startswith('{"type": "serving"'):
                return handle, f"http://{ip}:{json.loads(line)['port']}"
        if not ex.alive(handle):
            break
        time.sleep(0.2)
    tail = ex.read_log(handle, 5).strip()[-300:]
    ex.terminate(handle, 2.0)
    raise ExecError(f"the checkpoint server did not start on {ip}: {tail or 'no output'}", host=ex.host)


def _stop_servers(fleet: NodeFleet, servers: dict[int, tuple[ProcessHandle, str]], source: Source) -> None:
    while servers:
        r, (handle, _) = servers.popitem()
        try:
            fleet.executor(source.rank if r == -1 and source.rank is not None else r).terminate(handle, 2.0)
        except ExecError:
            pass


class _Chain:
    """Per (rank, file): set once the file is verified there, or once it never will be."""

    def __init__(self, ranks: list[int], names: list[str]) -> None:
        self.ranks = ranks
        self.done = {(r, n): threading.Event() for r in ranks for n in names}
        self.ok: dict[tuple[int, str], bool] = {}
        self.gone: set[int] = set()  # nodes whose server failed a pull: no node pulls from them again
        self.abort = threading.Event()
        self.fatal: K3Error | None = None

    def settle(self, rank: int, name: str, ok: bool) -> None:
        self.ok[(rank, name)] = ok
        self.done[(rank, name)].set()

    def wait_settled(self, timeout_s: float) -> None:
        """Wait (bounded) until every node's thread has settled every file: done, failed or skipped."""
        deadline = time.monotonic() + timeout_s
        for event in self.done.values():
            if not event.wait(max(0.0, deadline - time.monotonic())):
                return

    def feeder(self, rank: int, name: str) -> int | None:
        """The nearest node before `rank` that holds `name` verified (waiting on each), or None: the source."""
        for before in reversed(self.ranks[:self.ranks.index(rank)]):
            if before in self.gone:
                continue
            while not self.done[(before, name)].wait(0.5):
                if self.abort.is_set():
                    return None
            if self.ok[(before, name)] and before not in self.gone:
                return before
        return None


def sync(fleet: NodeFleet, targets: dict[int, tuple[str, str]], manifest: Manifest, source: Source, *,
         log_dir: str, manifest_file: str = "the manifest", progress: Progress | None = None,
         shared: SharedStorage | None = None) -> SyncReport:
    """Make every target rank's directory (rank -> (private ip, path)) hold exactly the manifest's files: one copy
    per storage (`shared`, else `shared_storage` asks the nodes), the other nodes on it reported shared with it."""
    t0 = time.monotonic()
    check_paths(manifest, manifest_file)
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
    servers: dict[int, tuple[ProcessHandle, str]] = {}
    chain = _Chain(sorted(live), names)
    try:
        started = fleet.map(lambda r, ex: _serve(ex, f"{r}", paths[r], targets[r][0], log_dir, run), list(live),
                            in_pool=True)
        for r, o in started.items():
            if not o.ok:  # a node that cannot serve is lost for this run: named, the others go on
                report.nodes[r].error = str(o.error)
            else:
                assert o.value is not None
                servers[r] = o.value
        src_url = source.url
        if source.rank is not None:
            src = _serve(fleet.executor(source.rank), "source", source.directory, source.ip, log_dir, run)
            servers[-1] = src
            src_url = src[1]

        def node(rank: int, ex: Executor) -> None:
            verified = set(live[rank].verified)
            for i, name in enumerate(names):
                if report.nodes[rank].error is not None or chain.abort.is_set():
                    chain.settle(rank, name, False)
                    continue
                if name in verified:
                    if progress is not None:
                        progress(rank, name, -1)
                    chain.settle(rank, name, True)
                    continue
                try:
                    while True:  # a node before that fails to serve it is passed over (each once, then the source)
                        before = chain.feeder(rank, name)
                        if chain.abort.is_set():
                            break
                        try:
                            sent = _copy(ex, rank, name, manifest, paths[rank], source,
                                         servers[before][1] if before is not None else src_url, before is None,
                                         progress)
                            break
                        except FeederFailed:
                            assert before is not None
                            chain.gone.add(before)
                    if chain.abort.is_set():
                        chain.settle(rank, name, False)
                        continue
                except (HubFailed, InputError) as exc:  # the hub failed the first node: no other would do better
                    chain.fatal = chain.fatal or exc
                    chain.abort.set()
                    chain.settle(rank, name, False)
                    continue
                except DiskFull as exc:  # this node stops, named with its free and needed bytes; the others go on
                    need = sum(manifest.files[n].size for n in names[i:] if n not in verified)
                    report.nodes[rank].error = f"{exc} ({need:,} bytes still needed there)"
                    report.nodes[rank].full = True
                    chain.settle(rank, name, False)
                    continue
                except ExecError as exc:  # the node is lost: named; the nodes after it pull from before it
                    report.nodes[rank].error = str(exc)
                    chain.settle(rank, name, False)
                    continue
                except SyncError as exc:
                    chain.fatal = chain.fatal or exc
                    chain.abort.set()
                    chain.settle(rank, name, False)
                    continue
                report.nodes[rank].sent += 1
                report.nodes[rank].bytes += sent
                chain.settle(rank, name, True)

        try:
            fleet.map(node, chain.ranks, in_pool=True)
        except BaseException:  # interrupted (Ctrl-C, `kill`): no node starts another file; partial ones are kept
            chain.abort.set()
            _stop_servers(fleet, servers, source)  # the pulls under way end at once (resumed by a rerun)
            chain.wait_settled(SERVE_START_S)  # before the fleet closes the connections the nodes' threads use
            raise
    finally:
        _stop_servers(fleet, servers, source)
    if chain.fatal is not None:
        raise chain.fatal
    for rank, owner in storage.owner.items():  # one storage: the owner's copy is theirs, nothing was sent to them
        if owner != rank:
            n = report.nodes[rank]
            n.shared_with = f"{fleet.host(owner)}:{paths[owner]} ({storage.fs[rank]})"
            n.error, n.full = report.nodes[owner].error, report.nodes[owner].full
    report.elapsed_s = time.monotonic() - t0
    return report


def _copy(ex: Executor, rank: int, name: str, manifest: Manifest, path: str, source: Source, url: str | None,
          from_source: bool, progress: Progress | None) -> int:
    """One file onto one node: pulled from `url` (a node's server), or put from this machine; verified, renamed.
    The bytes that moved; SyncError when the source's copy is corrupt."""
    want = manifest.files[name]
    spec: dict[str, Any] = {"op": "fetch", "path": path, "name": name, "size": want.size, "sha256": want.sha256,
                            "url": None}
    if url is None:  # this machine is the source: the executor puts the file at its temporary name
        tmp = weights_node.temp_name(path, name)
        ex.run(["mkdir", "-p", posixpath.dirname(tmp)], 60.0)
        ex.put(str(Path(source.directory) / name), tmp)
    else:
        spec["url"] = f"{url}/{urllib.parse.quote(name)}"

    def on_line(line: str) -> None:
        if progress is not None and line.startswith('{"type": "progress"'):
            progress(rank, name, int(json.loads(line)["done"]))

    res = ex.run([NODE_PYTHON, "-c", probe_source(weights_node), json.dumps(spec)],
                 BASE_TIMEOUT_S + want.size / MIN_COPY_BYTES_PER_S, on_line=on_line)
    try:
        out = parse_probe_output(res, ex.host)
    except ProbeError as exc:  # the copy ended without its answer: killed, or its node lost
        raise ExecError(f"copying {name} to {path} ended without a result, killed or its node lost: "
                        f"{str(exc).removeprefix(ex.host + ': ')}", host=ex.host) from None
    if not out.get("ok") and out.get("full"):
        raise DiskFull(f"{ex.host}: the disk at {path} filled up while {name} ({want.size:,} bytes) was written: "
                       f"{int(out['free']):,} bytes free; its partial file was removed, nothing of it kept at its "
                       "name", hint=f"free space on {ex.host} (or point model.path at a larger disk) and rerun: "
                       "verified files are kept")
    if not out.get("ok"):
        if out.get("corrupt") and from_source:
            raise SyncError(f"source file {posixpath.join(source.directory, name)} is corrupt, refused at "
                            f"{ex.host}: {out['error']}; nothing of it was kept",
                            hint="replace that file in the source (or download it again) and rerun")
        if from_source and source.url is not None:
            _hub_failed(out, source.url, name, ex.host)
        if not from_source:  # this node ran its copy and answered: the node it pulled from failed it
            raise FeederFailed(f"copying {name} from {url} failed: {out.get('error')}", host=ex.host)
        raise ExecError(f"copying {name} to {path} failed: {out.get('error')}", host=ex.host)
    if progress is not None:
        progress(rank, name, -1)
    return want.size if url is None else int(out.get("bytes", 0))


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


def run_sync(prep: Any, nodes: dict[tuple[str, str], list[Any]], manifest: Manifest, source: Source,
             source_target: Any, manifest_file: str, quiet: bool) -> SyncReport:
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

        log_dir = prep.plan.topology.launch.log_dir
        report = sync(fleet, targets, manifest, source, log_dir=log_dir, manifest_file=manifest_file,
                      progress=tick, shared=shared)
    if not quiet:
        for n in report.nodes.values():
            fix = "free space there (or point model.path at a larger disk), then rerun" if n.full else \
                "rerun to complete it"
            what = f"error: {n.error} ({fix})" if n.error else \
                f"the same storage as {n.shared_with}: synced there" if n.shared_with else \
                f"{n.sent} files, {n.bytes:,} bytes copied, {n.skipped} already verified"
            console.print(f"{n.host}:{n.path}: {what}")
    return report
