"""The sbatch export of several instances behind a router (replicas, or prefill/decode roles): one job.

One allocation holds every instance's nodes (one sbatch, one scancel ends everything); each instance runs
as its own step on its own nodes (`srun --relative`, `--kill-on-bad-exit=1`), so one instance failing ends
that instance's step only and the others keep serving, as a launch keeps them. A step's SLURM_NODEID counts
from its own first node, so each instance's node script is the single deployment's. Each instance's head
address is read on its first node by a one-task step; the router runs as a step on node 0 (`--overlap`:
beside replica 0's rank 0, whose step holds that node's CPUs and GPUs) and reaches every instance by those
addresses.
"""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs, host_port, places
from k3deploy.engines.render import packaged_vendor
from k3deploy.engines.router import RouterSettings, router_argv
from k3deploy.engines.shell import expansion, quote
from k3deploy.engines.slurm_job import _IP_FN, HEAD_IP_VAR, directives, node_count_guard, node_script


def _head_var(j: int) -> str:
    return f"K3_HEAD_IP_{j}"


def _worker_url(j: int, inp: Inputs) -> str:
    return f"http://{host_port(expansion(_head_var(j)), inp.topology.engine.port)}"


def _router_step(s: RouterSettings, members: Sequence[Inputs], python: str) -> str:
    """The router's step on node 0: bound to instance 0's head address, workers by their heads' addresses."""
    urls = {j: _worker_url(j, inp) for j, inp in enumerate(members)}
    if s.prefill:
        pre = [j for j, inp in enumerate(members) if inp.pd is not None and inp.pd.mode == "prefill"]
        dec = [j for j, inp in enumerate(members) if inp.pd is not None and inp.pd.mode == "decode"]
        s = dataclasses.replace(s, prefill=tuple((urls[j], port) for j, (_, port) in zip(pre, s.prefill)),
                                decode=tuple(urls[j] for j in dec))
    else:
        s = dataclasses.replace(s, worker_urls=tuple(urls.values()))
    s = dataclasses.replace(s, listen=expansion(_head_var(0)))
    argv = ("srun", "--overlap", "--nodes=1", "--ntasks=1", "--relative=0", *router_argv(s, python))
    return " ".join(quote(w, template=True) for w in argv) + " &"


def group_job_text(name: str, members: Sequence[Inputs], router: RouterSettings | None, *, labels: Sequence[str],
                   router_python: str = "python3", vendor: VendorSpec | None = None) -> str:
    """The sbatch script: every member (labelled) as a step on its own nodes, then the router's step."""
    t = members[0].topology
    vend = vendor if vendor is not None else packaged_vendor(members[0].hardware.vendor)
    counts = [len(places(m.topology)) for m in members]
    total = sum(counts)
    gpus = t.hardware.gpus_per_node if members[0].hardware.vendor in ("nvidia", "amd") else None
    lines = ["#!/bin/sh", *directives(name, total, t.launch.slurm, gpus),
             f"# k3deploy: {name}: {len(members)} instance(s) on {total} node(s) in one job, each instance its own",
             "# step on its own nodes (rank = SLURM_NODEID within the step); one failing leaves the others",
             "# serving. Each instance's head address is read on its first node. `scancel` ends everything.",
             "set -eu", node_count_guard(total)]
    offset = 0
    for j, (m, n, label) in enumerate(zip(members, counts, labels)):
        var, iface = _head_var(j), shlex.quote(places(m.topology)[0].iface)
        probe = shlex.quote(f"{_IP_FN}\nk3_ip {iface}")
        lines += [f"# ----- {label}: {m.topology.name}, nodes {offset}..{offset + n - 1} -----",
                  "# shellcheck disable=SC2016  # the probe is expanded on the node",
                  f'{var}="$(srun --nodes=1 --ntasks=1 --relative={offset} sh -c {probe})"',
                  (f'[ -n "${{{var}}}" ] || {{ echo "k3deploy: {label}: no IPv4 address on interface "{iface} '
                   f'"on its first node" >&2; exit 1; }}'),
                  f'{HEAD_IP_VAR}="${{{var}}}"', f"export {HEAD_IP_VAR}",
                  "# Expanded on each node by srun's shell, not here.", "# shellcheck disable=SC2016",
                  f"K3_NODE_SCRIPT={shlex.quote(node_script(m, vend))}",
                  (f"srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --relative={offset} --kill-on-bad-exit=1 "
                   'sh -c "${K3_NODE_SCRIPT}" &'),
                  f'echo "k3deploy: {label} started, head ${{{var}}}"']
        offset += n
    if router is not None:
        lines += [f"# ----- router {router.kind} on node 0 -----", _router_step(router, members, router_python),
                  f'echo "k3deploy: router {router.kind} at http://${{{_head_var(0)}}}:{router.port}"']
    lines += ["wait"]
    return "\n".join(lines) + "\n"
