"""The two network checks that need every node at once: the rendezvous port (a real listener on the head,
a real connect from each worker) and the collective probe (torch.distributed with the engine's env)."""
from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

from k3deploy.engines.context import host_port
from k3deploy.executors.base import Executor
from k3deploy.executors.fleet import NODE_PYTHON, NodeFleet, NodeOutcome, parse_probe_output, probe_source
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.preflight.report import Verdict
from k3deploy.probes import collective_probe, port_probe

PORT_PROBE, COLLECTIVE_PROBE = port_probe, collective_probe
CONNECT_WAIT_S = 5.0
# The executor's own bound on the torch probe: import torch (~2 s, more on a loaded node) + the watchdog.
IMPORT_ALLOWANCE_S = 60.0


def port_check(fleet: NodeFleet, nodes: Mapping[int, NodeJob], port: int, ranks: list[int]) -> tuple[Verdict, ...]:
    """Bind the port on the head's ip (and say who holds it when taken); every worker connects to it."""
    head = min(nodes)
    head_ip, addr = nodes[head].ip, host_port(nodes[head].ip, port)
    workers = [r for r in ranks if r != head]
    listen: dict[int, NodeOutcome[Any]] = {}

    def serve() -> None:
        listen.update(fleet.run_probe(PORT_PROBE, ["listen", head_ip, str(port), str(len(workers)),
                                                   str(CONNECT_WAIT_S + 2)], timeout_s=CONNECT_WAIT_S + 30,
                                      ranks=[head]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    dials = fleet.run_probe(PORT_PROBE, timeout_s=CONNECT_WAIT_S + 30, ranks=workers,
                            args_for=lambda r: ["connect", head_ip, str(port), str(r), str(CONNECT_WAIT_S)])
    thread.join(CONNECT_WAIT_S + 40)
    h = listen.get(head)
    answer: dict[str, Any] = h.value if h is not None and h.ok and isinstance(h.value, dict) else {}
    head_v = Verdict(rank=head, host=nodes[head].host, status="pass", detail=f"listened on {addr}")
    if not answer:
        head_v = Verdict(rank=head, host=nodes[head].host, status="error",
                         detail=f"not checked: {h.error if h is not None else 'no answer'}")
    elif not answer["ok"]:
        head_v = Verdict(rank=head, host=nodes[head].host, status="fail",
                         detail=f"cannot listen on {addr}: {answer['error']}{port_probe.held_by(answer)}",
                         fix=f"stop what holds port {port} on the head, or set launch.port to a free port")
    out = [head_v]
    heard = set(answer.get("ranks", [])) if answer.get("ok") else None
    for rank in workers:
        d, host = dials[rank], nodes[rank].host
        dial: dict[str, Any] = d.value if d.ok and isinstance(d.value, dict) else {}
        if not dial:
            out.append(Verdict(rank=rank, host=host, status="error", detail=f"not checked: {d.error}"))
        elif not dial["ok"]:
            out.append(Verdict(rank=rank, host=host, status="fail",
                               detail=f"cannot connect to the head's {addr}: {dial['error']}",
                               fix=f"open TCP port {port} from this node to the head on the private network "
                                   f"(firewall, routes), or fix nodes[0].ip"))
        elif heard is None:
            out.append(Verdict(rank=rank, host=host, status="skip",
                               detail=f"connected to {addr}, but not to our listener (see the head)"))
        elif rank in heard:
            out.append(Verdict(rank=rank, host=host, status="pass",
                               detail=f"connected to {addr} in {dial['connect_s']:.2f} s"))
        else:
            out.append(Verdict(rank=rank, host=host, status="fail",
                               detail=f"connected to {addr} but the head's listener never saw it (a proxy or NAT?)",
                               fix="make the head's private ip reachable directly"))
    return tuple(sorted(out, key=lambda v: v.rank))


# Error texts of Gloo/c10d -> the likely cause and fix, most specific first.
CAUSES: tuple[tuple[str, str, str], ...] = (
    (r"Unable to find address for", "the interface variable names no usable interface on this node",
     "set nodes[].iface to the node's private interface"),
    (r"connectFullMesh failed|Connection refused|Connection reset",
     "Gloo could not connect the ranks: some node's interface variable is on a network the others cannot reach",
     "make every node's iface the private interface holding its ip"),
    (r"No module named|no_torch", "the engine's interpreter has no torch", ("point engine.launcher at the engine's "
     "interpreter")),
    (r"version|undefined symbol", "torch versions differ between nodes", "install the same engine build everywhere"),
)


def diagnose(answer: dict[str, Any], head_addr: str) -> tuple[str, str]:
    """(likely cause, fix) from one rank's failure."""
    text = answer.get("error", "")
    for pattern, cause, fix in CAUSES:
        if re.search(pattern, text):
            return cause, fix
    if answer.get("timeout") or "timed out" in text.lower() or "timeout" in text.lower():
        if answer.get("stage") == "init_process_group":
            return ((f"the group never formed at {head_addr} (head unreachable, port blocked, or another rank "
                    "failed first)"), f"check that {head_addr} is reachable from every node")
        return (f"stuck in {answer.get('stage')}: a peer is unreachable on its interface",
                "check the interface variables on every node")
    return "the collective failed", "see the error"


def _culprits(answers: Mapping[int, dict[str, Any]], nodes: Mapping[int, NodeJob]) -> dict[int, tuple[str, str]]:
    """The ranks most likely at fault, with cause and fix: an interface variable that is not the node's
    iface first (the others then fail or hang because of it), else ranks with an error of their own (the
    ranks that merely timed out were waiting for them)."""
    wrong = {r: a for r, a in answers.items() if not a["ok"] and
             any(v != nodes[r].iface for v in a.get("ifname", {}).values())}
    if wrong:
        return {r: ((f"{', '.join(f'{k}={v}' for k, v in a['ifname'].items())} on a node whose private interface "
                    f"is {nodes[r].iface}"), f"set the interface variables to {nodes[r].iface} (remove overrides)")
                for r, a in wrong.items()}
    own = {r: a for r, a in answers.items() if not a["ok"] and not a.get("timeout")}
    return {r: diagnose(a, "") for r, a in own.items()} if len(own) < len(answers) else {}


def collective_check(fleet: NodeFleet, nodes: Mapping[int, NodeJob], port: int, *, nbytes: int, timeout_s: float,
                     backends: str = "gloo", env_override: Mapping[int, Mapping[str, str]] | None = None,
                     ) -> tuple[tuple[Verdict, ...], dict[int, dict[str, Any]]]:
    """Every rank joins tcp://HEAD:PORT with its rendered env and all_reduces `nbytes`; per-node verdicts
    and measurements (seconds, algbw and busbw in GB/s as nccl-tests defines them)."""
    source = probe_source(COLLECTIVE_PROBE)
    head = min(nodes)
    addr = host_port(nodes[head].ip, port)
    world = len(nodes)

    def one(rank: int, ex: Executor) -> Any:
        node = nodes[rank]
        env = {**node.env, **(env_override or {}).get(rank, {})}
        argv = [node.engine_python or NODE_PYTHON, "-c", source, f"tcp://{addr}", str(rank), str(world),
                str(nbytes), str(timeout_s), backends]
        return parse_probe_output(ex.run(argv, timeout_s + IMPORT_ALLOWANCE_S, env=env), ex.host)

    outs = fleet.map(one, sorted(nodes))
    answers = {r: o.value for r, o in outs.items() if o.ok and isinstance(o.value, dict)}
    verdicts, measured = [], {}
    culprits = _culprits(answers, nodes)
    for rank in sorted(nodes):
        o, host = outs[rank], nodes[rank].host
        if not o.ok:
            verdicts.append(Verdict(rank=rank, host=host, status="error", detail=f"not checked: {o.error}"))
            continue
        a = answers[rank]
        if a["ok"]:
            measured[rank] = {"elapsed_s": a["elapsed_s"], **a["results"]}
            ran = {b: r for b, r in a["results"].items() if "skipped" not in r}
            skipped = "".join(f"; {b} skipped: {r['skipped']}" for b, r in a["results"].items() if b not in ran)
            verdicts.append(Verdict(rank=rank, host=host, status="pass", detail=", ".join(
                f"{b} all_reduce of {r['bytes'] / 2**20:.0f} MiB correct in {r['seconds'] * 1e3:.0f} ms, "
                f"busbw {r['busbw_gbps']:.2f} GB/s" for b, r in ran.items()) + skipped))
            continue
        ifn = ", ".join(f"{k}={v}" for k, v in a.get("ifname", {}).items()) or "no interface variable"
        if rank in culprits:
            cause, fix = culprits[rank]
            detail = f"{a['error']} (stage {a['stage']}; {ifn}): likely {cause}"
        elif culprits:
            who = ", ".join(f"rank {r} ({nodes[r].host})" for r in culprits)
            detail, fix = f"{a['error']} (stage {a['stage']}): a peer failed first: {who}", f"fix {who}"
        else:
            cause, fix = diagnose(a, addr)
            detail = f"{a['error']} (stage {a['stage']}; {ifn}): likely {cause}"
        verdicts.append(Verdict(rank=rank, host=host, status="fail", detail=detail, fix=fix))
    return tuple(verdicts), measured
