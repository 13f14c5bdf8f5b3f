"""Host checks: reachability, hostname, interface, MTU, clock, checkpoint, shared memory."""
from __future__ import annotations

import ipaddress
from typing import Any

from k3deploy.preflight.context import Check, Context, Judged, agree, judged_or, per_node
from k3deploy.preflight.interfaces import address_verdict, is_up, missing
from k3deploy.preflight.report import Verdict

GIB = 2**30
# Clock skew beyond this breaks TLS, token expiry and log correlation across nodes; the probe's own round
# trip is added to the bound (it is the uncertainty of the measurement).
MAX_CLOCK_SKEW_S = 2.0
# Shared memory for NCCL/RCCL/HCCL buffers and the engines' multiprocess tensors: vLLM and SGLang docs run
# containers with --ipc=host or --shm-size of 16 GiB and more; the stand-in needs almost none.
MIN_SHM_BYTES = {"sim": 64 * 2**20}
MIN_SHM_BYTES_DEFAULT = 16 * GIB
IFNAME_SUFFIX = "_SOCKET_IFNAME"


def _reachability(ctx: Context) -> tuple[Verdict, ...]:
    return per_node(ctx, lambda r, f: ("pass", f"connected; python3 {f.get('python', '?')}", ""))


def _hostname(rank: int, f: dict[str, Any], ctx: Context) -> Judged:
    h = f["host"]
    loop = [a for a in h["resolves_to"] if _loopback(a)]
    node = ctx.nodes[rank]
    if loop and not _loopback(node.ip):  # a single-machine topology rendezvouses on loopback on purpose
        return ("fail", (f"hostname {h['hostname']} resolves to {', '.join(loop)} (loopback): the engine and Gloo "
                        "then pick a loopback address and the mesh never connects"),
                f"map {h['hostname']} to {node.ip} in the node's /etc/hosts (drop its 127.0.1.1 line)")
    if not h["resolves_to"]:
        return ("pass", f"hostname {h['hostname']} does not resolve (harmless: the interface variables are set)", "")
    return ("pass", f"{h['hostname']} -> {', '.join(h['resolves_to'])}", "")


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def _iface(rank: int, f: dict[str, Any], ctx: Context) -> Judged:
    node = ctx.nodes[rank]
    fix_field = "fix nodes[].iface"
    wrong_env = {k: v for k, v in node.env.items() if k.endswith(IFNAME_SUFFIX) and v != node.iface}
    if wrong_env:
        names = ", ".join(f"{k}={v}" for k, v in sorted(wrong_env.items()))
        return ("fail", f"the engine env sets {names} but nodes[].iface is {node.iface}",
                "remove the override from engine.env (k3deploy sets it from nodes[].iface)")
    i = f.get("iface")
    if i is None:
        return ("skip", "no iface configured", "")
    if not i["present"]:
        return ("fail", missing(node.iface, i["all"]), fix_field)
    if is_up(i.get("flags", "")) is False:
        return ("fail", f"{node.iface} is down", f"bring it up (ip link set dev {node.iface} up) or {fix_field}")
    why = address_verdict(node.iface, node.ip, i.get("ip_addr"))
    if why:
        return ("fail", why, "fix nodes[].ip or nodes[].iface")
    return ("pass", f"{node.iface} up, holds {node.ip}", "")


def _mtu(ctx: Context) -> tuple[Verdict, ...]:
    mtus = {r: (f.get("iface") or {}).get("mtu") or None for r, f in ctx.facts.items()}
    judged = agree(mtus, "MTU")
    fixed = {r: (s, d, f"set the same MTU on every node's private interface (ip link set dev "
                     f"{ctx.nodes[r].iface} mtu N)" if s == "fail" else "") for r, (s, d, _f) in judged.items()}
    return per_node(ctx, judged_or(fixed, ("skip", "interface missing (see iface)", "")))


def _clock(rank: int, f: dict[str, Any], ctx: Context) -> Judged:
    before, after = ctx.clock[rank]
    skew = f["time"] - (before + after) / 2
    bound = MAX_CLOCK_SKEW_S + (after - before) / 2
    if abs(skew) > bound:
        way = "ahead of" if skew > 0 else "behind"
        return ("fail", f"clock {abs(skew):.1f} s {way} this machine (allowed {MAX_CLOCK_SKEW_S:g} s)",
                "synchronise clocks on every node (chrony or systemd-timesyncd)")
    return ("pass", f"skew {skew:+.2f} s (+/- {(after - before) / 2:.2f})", "")


def _sync(ctx: Context) -> str:
    return f"k3deploy weights sync {ctx.plan.file} --from DIR|HOST:DIR|hub (every node, verified)"


def _checkpoint(rank: int, f: dict[str, Any], ctx: Context) -> Judged:
    c, t = f["checkpoint"], ctx.plan.topology
    need = ctx.plan.model.weights.total_bytes if ctx.plan.model else 0
    if not c["is_dir"]:
        free = f"{c['free_bytes'] / GIB:.0f} GiB free there" if c["free_bytes"] is not None else "no such filesystem"
        short = c["free_bytes"] is not None and c["free_bytes"] < need
        room = f"; not enough for the {need / GIB:.0f} GiB checkpoint" if short else ""
        return ("fail", f"no checkpoint at {c['path']} ({free}{room})",
                f"download the checkpoint to {t.model.path} on this node (the path must be the same on every node): "
                + _sync(ctx))
    if not c["index"]:
        return ("fail", (f"{c['path']} has no readable model.safetensors.index.json and no single "
                         f"model.safetensors ({c.get('index_error', '')})"),
                f"re-download the checkpoint (the index lists every shard): {_sync(ctx)}")
    if c["missing_shards"]:
        return ("fail", (f"{len(c['missing_shards'])} shard(s) listed in the index are missing, e.g. "
                        f"{c['missing_shards'][0]}"), f"finish or repeat the download on this node: {_sync(ctx)}")
    pinned = t.model.revision
    if pinned and c["revision"] and any(r != pinned for r in c["revision"]):
        return ("fail", f"checkpoint revision {', '.join(c['revision'])} but model.revision pins {pinned}",
                f"download revision {pinned} (hf download --revision {pinned} --local-dir {t.model.path})")
    rev = f", revision {c['revision'][0]}" if c["revision"] else ""
    if c.get("single_file"):
        return ("pass", f"one model.safetensors (the single-file form, no index){rev}", "")
    return ("pass", f"{c['shards']} shards indexed, all present{rev}", "")


def _shm(rank: int, f: dict[str, Any], ctx: Context) -> Judged:
    s = f["shm"]
    if "error" in s:
        return ("fail", f"/dev/shm unusable: {s['error']}", "mount a tmpfs on /dev/shm")
    need = MIN_SHM_BYTES.get(ctx.vendor, MIN_SHM_BYTES_DEFAULT)
    if s["total"] < need:
        return ("fail", f"/dev/shm is {s['total'] / GIB:.2f} GiB, needs {need / GIB:.2f} GiB",
                "enlarge /dev/shm (mount -o remount,size=... /dev/shm; containers: --shm-size or --ipc=host)")
    return ("pass", f"{s['total'] / GIB:.1f} GiB", "")


def _each(judge: Any) -> Any:
    return lambda ctx: per_node(ctx, lambda r, f: judge(r, f, ctx))


HOST_CHECKS = (
    Check("reachability", "Reachable", "connect and authenticate with the launch executor; run python3",
          _reachability),
    Check("hostname", "Hostname", "socket.getaddrinfo(gethostname()): no loopback address", _each(_hostname)),
    Check("iface", "Interface", "/sys/class/net/IFACE (present, IFF_UP) and `ip -o addr show dev IFACE` holds ip; "
          "the engine env's *_SOCKET_IFNAME equal iface", _each(_iface)),
    Check("mtu", "MTU", "/sys/class/net/IFACE/mtu equal on every node", _mtu),
    Check("clock", "Clock", f"the node's time.time() against this machine's (skew <= {MAX_CLOCK_SKEW_S:g} s)",
          _each(_clock)),
    Check("checkpoint", "Checkpoint", "model.path: index present, every shard present, revision as pinned; "
          "else the free disk there", _each(_checkpoint)),
    Check("shm", "/dev/shm", "size of /dev/shm", _each(_shm)),
)
