"""The sbatch export of several instances behind a router (replicas, or prefill/decode roles): one job.

One allocation holds every instance's nodes (one sbatch, one scancel ends everything); each instance runs
as its own step on its own nodes (`srun --relative`, `--kill-on-bad-exit=1`), so one instance failing ends
that instance's step only and the others keep serving, as a launch keeps them. A step's SLURM_NODEID counts
from its own first node, so each instance's node script is the single deployment's. Each instance's head
address is read on its first node by a one-task step. The router goes where `router.runs_on` says: a node of
the topology is the job's node that runs that node's rank (a step there, `--overlap`: beside that rank,
whose step holds the node's CPUs and GPUs), bound to that node's address; `local` (where k3deploy runs) is
no node of the job, so the job prints the router's command with the instances' addresses, to run there.
"""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.context import Inputs, host_port, places
from k3deploy.engines.render import packaged_vendor
from k3deploy.engines.router import RouterSettings, router_argv
from k3deploy.engines.shell import expansion, printed, quote
from k3deploy.engines.slurm_job import _IP_FN, HEAD_IP_VAR, directives, node_count_guard, node_script
from k3deploy.topology.nodes import Node

ROUTER_IP_VAR = "K3_ROUTER_IP"


def _head_var(j: int) -> str:
    return f"K3_HEAD_IP_{j}"


def _worker_url(j: int, inp: Inputs) -> str:
    return f"http://{host_port(expansion(_head_var(j)), inp.topology.engine.port)}"


def _routed(s: RouterSettings, members: Sequence[Inputs]) -> RouterSettings:
    """The router's settings with every instance by its head's address (read in the job)."""
    urls = {j: _worker_url(j, inp) for j, inp in enumerate(members)}
    if s.prefill:
        pre = [j for j, inp in enumerate(members) if inp.pd is not None and inp.pd.mode == "prefill"]
        dec = [j for j, inp in enumerate(members) if inp.pd is not None and inp.pd.mode == "decode"]
        return dataclasses.replace(s, prefill=tuple((urls[j], port) for j, (_, port) in zip(pre, s.prefill)),
                                   decode=tuple(urls[j] for j in dec))
    return dataclasses.replace(s, worker_urls=tuple(urls.values()))


def router_place(members: Sequence[Inputs], node: Node) -> tuple[int, int, int]:
    """(instance, rank, node of the job) of the topology's node `node`: instance j's rank r is the job's node
    (its nodes before j) + r."""
    offset = 0
    for j, m in enumerate(members):
        ranked = m.topology.ordered_nodes()
        for r, n in ranked:
            if (n.host, n.ip) == (node.host, node.ip):
                return j, r, offset + r
        offset += len(ranked)
    raise ValueError(f"node {node.host} ({node.ip}) is in no instance")  # the topology checks say every node is


def _probe(var: str, relative: int, iface: str, what: str, where: str) -> list[str]:
    """The address of `iface` on the job's node `relative`, read there by a one-task step, into `var`."""
    q = shlex.quote(iface)
    probe = shlex.quote(f"{_IP_FN}\nk3_ip {q}")
    return ["# shellcheck disable=SC2016  # the probe is expanded on the node",
            f'{var}="$(srun --nodes=1 --ntasks=1 --relative={relative} sh -c {probe})"',
            (f'[ -n "${{{var}}}" ] || {{ echo "k3deploy: {what}: no IPv4 address on interface "{q} "{where}" >&2; '
             'exit 1; }')]


def _router_lines(s: RouterSettings, members: Sequence[Inputs], labels: Sequence[str], python: str,
                  node: Node | None) -> tuple[list[str], list[str]]:
    """(lines before the instances start, lines after): the router's step on its node, or its printed command."""
    s = _routed(s, members)
    if node is None:
        return [], [f"# ----- router {s.kind}: router.runs_on local, the host running k3deploy: not in this job -----",
                    "# The instances' addresses are known only here: the job prints the router's command with",
                    "# them, to run on the host running k3deploy (which must reach them).",
                    (f'echo "k3deploy: router {s.kind} runs where k3deploy runs (router.runs_on: local): start it '
                     'there with:"'),
                    f'printf \'%s\\n\' "{printed(router_argv(s, python))}"']
    j, rank, relative = router_place(members, node)
    before: list[str] = []
    var = _head_var(j)
    if rank:  # not a head: its address is read before the instances' steps hold the node
        var = ROUTER_IP_VAR
        before = [f"# ----- the router's node: {node.host} ({labels[j]}'s rank {rank}, node {relative} of the job) -----",
                  *_probe(var, relative, node.iface, f"router {s.kind}", f"on {node.host}")]
    s = dataclasses.replace(s, listen=expansion(var))
    argv = ("srun", "--overlap", "--nodes=1", "--ntasks=1", f"--relative={relative}", *router_argv(s, python))
    return before, [f"# ----- router {s.kind} on node {relative} -----",
                    " ".join(quote(w, template=True) for w in argv) + " &",
                    f'echo "k3deploy: router {s.kind} at http://${{{var}}}:{s.port}"']


def group_job_text(name: str, members: Sequence[Inputs], router: RouterSettings | None, *, labels: Sequence[str],
                   router_python: str = "python3", router_node: Node | None = None,
                   vendor: VendorSpec | None = None) -> str:
    """The sbatch script: every member (labelled) as a step on its own nodes, then the router's step on
    `router_node` (the topology's node router.runs_on names; None: local, its command printed)."""
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
    before, after = _router_lines(router, members, labels, router_python, router_node) if router else ([], [])
    lines += before
    offset = 0
    for j, (m, n, label) in enumerate(zip(members, counts, labels)):
        var = _head_var(j)
        lines += [f"# ----- {label}: {m.topology.name}, nodes {offset}..{offset + n - 1} -----",
                  *_probe(var, offset, places(m.topology)[0].iface, label, "on its first node"),
                  f'{HEAD_IP_VAR}="${{{var}}}"', f"export {HEAD_IP_VAR}",
                  "# Expanded on each node by srun's shell, not here.", "# shellcheck disable=SC2016",
                  f"K3_NODE_SCRIPT={shlex.quote(node_script(m, vend))}",
                  (f"srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --relative={offset} --kill-on-bad-exit=1 "
                   'sh -c "${K3_NODE_SCRIPT}" &'),
                  f'echo "k3deploy: {label} started, head ${{{var}}}"']
        offset += n
    lines += [*after, "wait"]
    return "\n".join(lines) + "\n"
