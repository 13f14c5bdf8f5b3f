"""`k3deploy weights sync` fanned out node to node, against the floor and against copying to each node in turn.

Usage (root; builds its own rig of network-namespace hosts and removes it, with its disks and qdiscs):
    python bench/weights_fanout.py [--gib 2] [--files 64] [--rate-mb 40] [--sizes 4,8] [--sequential-sizes 4,8]

The rig: one source host and max(--sizes) target hosts, each with its OWN disk at the checkpoint path (a bind
mount of a private directory in the host's mount namespace: network namespaces alone share the file system),
every host's private link capped by `tc` tbf at --rate-mb MB/s each way (both ends of its veth). The source
host holds a generated checkpoint of random bytes (--files shards, --gib GiB in all) and its manifest; every
byte crosses the links for real (HTTP range requests between the hosts' private IPs, sha256-verified on each
node before its rename), exactly as `weights sync --from HOST:DIR` runs it (weights_sync.sync over SSH).

Runs, each onto empty target disks:
- floor: the sync to one node (one link at the rate; the pure link time, bytes / rate, printed beside it);
- fan-out to N nodes: one sync, the nodes chained (each pulls each file from the one before, which passes the
  bytes on as they arrive: all but the last until it has verified the file);
- sequential to N nodes: one sync per node in turn from the source (what copying from one source costs).
Prints each time, its ratio to the floor, and the bytes the source's link sent (fan-out ~1x the checkpoint,
sequential ~N x). Target: fan-out <= 1.3x the floor at 4 and at 8 nodes.

Measured (2 GiB in 64 shards, 2 shared cores under a load of 3-6 from other work; tbf queue 200 ms, the
default before the 20 ms one; the 40 MB/s run overlapped this author's integration test runs):
| rate | floor | fan-out 4 | fan-out 8 | sequential 4 | sequential 8 |
| 40 MB/s | 76.5 s (1.42x link) | 93.7 s, 1.23x | 120.4 s, 1.57x (host CPU 105 s: CPU-bound) | 299.3 s, 3.91x | 601.5 s, 7.87x |
| 20 MB/s | 131.0 s (1.22x link) | 154.3 s, 1.18x | 180.7 s, 1.38x (host CPU 114 s) | 574.6 s, 4.39x | not run |
The source's link sent 1.00x the checkpoint in every fan-out, 4.00x / 8.01x sequential.
After the s16 merge (sync() asks shared_storage itself; tbf queue 20 ms; 2 cores under a load of 7-10 from other
sessions' tests, so the ratios are noisy), `--rate-mb 20 --sequential-sizes ''`:
| rate | floor | fan-out 4 | fan-out 8 |
| 20 MB/s | 142.7 s (1.33x link, host CPU 14.7 s) | 170.8 s, 1.20x (host CPU 54.3 s) | 195.1 s, 1.37x (host CPU 108.9 s) |
What costs the chain at 8: each file is one SSH exec and one Python start per node (512 at 8 nodes; one start of
the probe measured 0.10 s CPU and 0.33 s wall under that load, so ~50 s of the 108.9 s host CPU) and each hop
waits for the file to be verified upstream (store and forward: 7 hops x ~2.2 s a 32 MB file, ~16 s of the
52 s over the floor; the rest is the hops' delays adding up on shared CPUs). Not yet tried: one long-lived
puller per node (one SSH command and one Python start for all its files) and serving a file onward while it
is still being written.
Since tried (session 17): one process per node serving and pulling (one start and one `follow` per node, files in
order, the next pulled while the last is fsync'd and renamed), cut through: a node passes a file on while it
arrives, holding back its last byte until it has verified it. Same rig, 2 shared cores under a load of 4-9 from
other sessions, `--rate-mb 20 --sequential-sizes ''`; before = the store-and-forward chain above, run again here:
| size | floor | fan-out 4 | fan-out 8 |
| 1 GiB in 32, before | 63.6 s (1.18x link, host CPU 7.5 s) | 76.1 s, 1.20x | 102.0 s, 1.60x (host CPU 62.0 s) |
| 1 GiB in 32, after | 57.5 s (1.07x link, host CPU 5.2 s) | 60.7 s, 1.06x | 67.9 s, 1.18x (host CPU 40.5 s) |
| 2 GiB in 64, after | 115.4 s (1.07x link, host CPU 11.1 s) | 122.3 s, 1.06x | 128.2 s, 1.11x (host CPU 71.0 s) |
(The 2 GiB fan-out 8 is from a second run, floor 115.2 s; the first lost one node to a race since fixed: its
process removed its plan file while the put still wrote it.) The source's link sent 1.00x the checkpoint in
every run. What is left over the floor at 8: the pipeline's fill (one 1 MiB read per hop) and CPU: 8 streams
through the kernel, sha256 and Python on 2 cores shared with other work.

On the 2-core machine, the hashing, the HTTP copies and the veths share the CPUs: the rate must leave the CPU
idle enough (fan-out to 8 moves 8 x rate through the kernel and the hashes); the run prints the CPU seconds used
by the hosts against the wall time so a CPU-bound run shows itself.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from k3deploy.checkpoint.manifest import FileDigest, Manifest
from k3deploy.cli.interrupts import sigterm_interrupts
from k3deploy.executors import NodeFleet, SshTarget
from k3deploy.launch.weights_sync import Source, SyncReport, sync
from tests.rig import PRIV_IFACE, HostRig, disks

CHUNK = 8 << 20


def _generate(root: Path, files: int, total: int) -> Manifest:
    """`files` shards of random bytes, `total` bytes in all, and their manifest."""
    root.mkdir(parents=True, exist_ok=True)
    size = total // files
    digests = {}
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        h = hashlib.sha256()
        with open(root / name, "wb") as f:
            left = size
            while left:
                chunk = os.urandom(min(CHUNK, left))
                f.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        digests[name] = FileDigest(size=size, sha256=h.hexdigest())
    return Manifest(revision="bench", files=digests)


def _cpu_s(rig: HostRig) -> float:
    """CPU seconds used so far inside the rig's hosts (sshd masters with their reaped children, live processes)."""
    total = 0
    for h in rig.hosts:
        for pid in {rig.sshd_pid(h), *rig.pids(h, root_ns=True)}:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


class Bench:
    """The rig, its disks, the source checkpoint; one run = one sync onto empty target disks."""

    def __init__(self, rig: HostRig, at: str, src: str, manifest: Manifest, key: dict[str, object]) -> None:
        self.rig, self.at, self.src, self.manifest, self.key = rig, at, src, manifest, key

    def wipe(self, n: int) -> None:
        for i in range(1, n + 1):
            for p in (self.rig.workdir / f"disk{i}").iterdir():  # the contents: the directory is bind-mounted
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def run(self, ranks: list[int]) -> tuple[float, int, float, SyncReport]:
        """Sync onto hosts h(rank+1) (rank 1 = h02): wall seconds, bytes the source sent, hosts' CPU seconds."""
        rig, src_host = self.rig, self.rig.hosts[0]
        targets = {r: SshTarget(host=rig.hosts[r].mgmt_ip, **self.key) for r in ranks}  # type: ignore[arg-type]
        targets[-1] = SshTarget(host=src_host.mgmt_ip, **self.key)  # type: ignore[arg-type]
        with NodeFleet(targets) as fleet:
            fleet.connect_all()
            tx0, cpu0 = rig.iface_bytes(src_host, PRIV_IFACE)[1], _cpu_s(rig)
            t0 = time.monotonic()
            report = sync(fleet, {r: (rig.hosts[r].priv_ip, self.at) for r in ranks}, self.manifest,
                          Source(self.src, rank=-1, ip=src_host.priv_ip), log_dir=str(rig.workdir / "logs"))
            wall = time.monotonic() - t0
            tx, cpu = rig.iface_bytes(src_host, PRIV_IFACE)[1] - tx0, _cpu_s(rig) - cpu0
        if report.exit_code != 0:
            raise SystemExit(f"sync failed: {report.as_json()}")
        total = sum(d.size for d in self.manifest.files.values())
        for r in ranks:  # every byte on every disk, checked again here (the nodes verified before renaming)
            disk = rig.workdir / f"disk{r}"
            got = sum(p.stat().st_size for p in disk.iterdir() if not p.name.startswith("."))
            if got != total:
                raise SystemExit(f"{rig.hosts[r].name}: {got:,} bytes on its disk, want {total:,}")
        return wall, tx, cpu, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size in GiB")
    ap.add_argument("--files", type=int, default=64, help="number of shards")
    ap.add_argument("--rate-mb", type=float, default=40.0, help="every link's rate, MB/s each way (tc tbf)")
    ap.add_argument("--queue-ms", type=int, default=20, help="each tbf's queue (its latency), ms")
    ap.add_argument("--sizes", default="4,8", help="fan-out node counts")
    ap.add_argument("--sequential-sizes", default="4,8", help="node counts copied one by one ('' to skip)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network and mount namespaces, tc)", file=sys.stderr)
        return 2
    sigterm_interrupts()  # `kill` unwinds like Ctrl-C: the rig, its disks and qdiscs are removed
    sizes = [int(s) for s in args.sizes.split(",") if s]
    seq = [int(s) for s in args.sequential_sizes.split(",") if s]
    n = max(sizes + seq)
    rate = int(args.rate_mb * 1e6)
    total = int(args.gib * (1 << 30)) // args.files * args.files
    with HostRig(n + 1, prefix="kwfb") as rig:
        at, src = str(rig.workdir / "ckpt"), str(rig.workdir / "src")
        disks.own_disk(rig, "h01", src, rig.workdir / "srcdisk")
        for i in range(1, n + 1):
            disks.own_disk(rig, rig.hosts[i].name, at, rig.workdir / f"disk{i}")
        t0 = time.monotonic()
        manifest = _generate(rig.workdir / "srcdisk", args.files, total)
        print(f"checkpoint: {args.files} files, {total:,} bytes of random data generated in "
              f"{time.monotonic() - t0:.1f} s on the source host's own disk")
        for h in rig.hosts:
            disks.limit(rig, h.name, rate, args.queue_ms)
        key = {"user": "root", "key": str(rig.key_path), "known_hosts": str(rig.known_hosts_path),
               "connect_timeout_s": 10.0}
        bench = Bench(rig, at, src, manifest, key)
        link_s = total / rate
        print(f"links: tc tbf {args.rate_mb:g} MB/s each way, queue {args.queue_ms} ms, on every host's private "
              "veth (both ends); "
              f"{os.cpu_count()} cores; pure link time for the checkpoint: {link_s:.1f} s", flush=True)
        rows: list[tuple[str, int, float, int, float]] = []
        print(f"{'run':<22} {'nodes':>5} {'wall s':>8} {'x floor':>8} {'x link':>7} {'source sent':>14} "
              f"{'x ckpt':>7} {'host CPU s':>10}", flush=True)

        def row(label: str, k: int, wall: float, tx: int, cpu: float) -> None:
            rows.append((label, k, wall, tx, cpu))
            print(f"{label:<22} {k:>5} {wall:>8.1f} {wall / rows[0][2]:>7.2f}x {wall / link_s:>6.2f}x {tx:>14,} "
                  f"{tx / total:>6.2f}x {cpu:>10.1f}", flush=True)

        bench.wipe(n)
        floor, tx, cpu, _ = bench.run([1])
        row("floor (1 node)", 1, floor, tx, cpu)
        for k in sizes:
            bench.wipe(n)
            wall, tx, cpu, _ = bench.run(list(range(1, k + 1)))
            row(f"fan-out ({k} nodes)", k, wall, tx, cpu)
        for k in seq:
            walls, txs, cpus = 0.0, 0, 0.0
            bench.wipe(n)
            for r in range(1, k + 1):
                wall, tx, cpu, _ = bench.run([r])
                walls, txs, cpus = walls + wall, txs + tx, cpus + cpu
            row(f"sequential ({k} nodes)", k, walls, txs, cpus)
        by = {(label.split()[0], k): wall for label, k, wall, _, _ in rows}
        for k in sizes:
            line = f"{k} nodes: fan-out {by[('fan-out', k)] / floor:.2f}x the floor (target <= 1.3x)"
            if ("sequential", k) in by:
                line += f", sequential {by[('sequential', k)] / floor:.2f}x, fan-out/sequential " \
                        f"{by[('fan-out', k)] / by[('sequential', k)]:.2f}"
            print(line)
        for h in rig.hosts:
            disks.unlimit(rig, h.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
