"""The one Slurm job text: `k3deploy render --format slurm` writes it, the Slurm executor submits it.

One batch script, one step of one task per node (`srun --kill-on-bad-exit=1`: Slurm ends the whole step
when any task fails). Each task picks its rank's command from SLURM_NODEID, read by srun's shell on the
node (the SGLang docs' recipe writes `$SLURM_NODEID` where the batch shell expands it, so every task
became rank 0). Addresses come from the allocation, not the topology: the batch script runs on the node
Slurm numbers 0, so the head address is rank 0's interface address there; each task takes its own from
its interface. The topology's nodes give their count, interfaces and order of ranks.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.batch import case_branches
from k3deploy.engines.context import Inputs, Place, places
from k3deploy.engines.render import launch_spec
from k3deploy.engines.shell import expansion, node_lines
from k3deploy.engines.spec import LaunchSpec
from k3deploy.topology.slurm import SlurmSettings

NODE_IP_VAR = "K3_NODE_IP"
HEAD_IP_VAR = "K3_HEAD_IP"
# IPv4 address of an interface, with iproute2 (as the rig and every Slurm node image we know have it).
_IP_FN = ("k3_ip() { ip -4 -o addr show dev \"$1\" 2>/dev/null | awk '{ split($4, a, \"/\"); print a[1]; exit }'; }")

# A launch turns one rank's body (exports + exec) into the command its task runs (detached and logged).
Wrap = Callable[[int, str], str]


def slurm_specs(inp: Inputs, vendor: VendorSpec | None) -> tuple[LaunchSpec, ...]:
    """Every rank's spec with its own and the head's address as shell expansions (taken on the node)."""
    return tuple(launch_spec(inp, Place(rank=p.rank, nnodes=p.nnodes, ip=expansion(NODE_IP_VAR),
                                        head_ip=expansion(HEAD_IP_VAR), iface=p.iface), vendor)
                 for p in places(inp.topology))


def directives(name: str, n: int, s: SlurmSettings, gpus_per_node: int | None) -> list[str]:
    """`#SBATCH` lines: one task per node, and each setting that is set."""
    out = [f"--job-name={name}", f"--nodes={n}", "--ntasks-per-node=1", "--exclusive"]
    for flag, value in (("--partition", s.partition), ("--account", s.account), ("--time", s.time_limit),
                        ("--gres", s.gres), ("--constraint", s.constraint)):
        if value:
            out.append(f"{flag}={value}")
    if s.nodelist:
        out.append("--nodelist=" + ",".join(s.nodelist))
    if gpus_per_node and not s.gres:
        out.append(f"--gpus-per-node={gpus_per_node}")
    return ["#SBATCH " + d for d in out]  # values are single words (topology/slurm.py)


def _address(var: str, iface: str, where: str) -> list[str]:
    q = shlex.quote(iface)
    return [f"{var}=\"$(k3_ip {q})\"",
            (f"[ -n \"${{{var}}}\" ] || {{ echo \"k3deploy: {where}: no IPv4 address on interface \"{q} >&2; "
             "exit 1; }"), f"export {var}"]


def node_script(inp: Inputs, vendor: VendorSpec | None, wrap: Wrap | None = None) -> str:
    """What srun's shell runs on every node of the deployment: its rank's command, by SLURM_NODEID."""
    specs = slurm_specs(inp, vendor)
    iface = {p.rank: p.iface for p in places(inp.topology)}
    branches: list[str] = []
    for s in specs:
        own = _address(NODE_IP_VAR, iface[s.rank], f"rank {s.rank} on ${{SLURMD_NODENAME:-this node}}")
        if wrap is None:
            branches += [f"{s.rank})", *("  " + line for line in own),
                         *case_branches((s,), template=True)[1:]]
        else:
            body = "\n".join(["set -eu", *node_lines(s, redact=True, template=True)])
            branches += [f"{s.rank})", *("  " + line for line in own), "  " + wrap(s.rank, body).replace(
                "\n", "\n  ").rstrip(), "  ;;"]
    node = ["set -eu", f': "${{{HEAD_IP_VAR}:?exported by the batch script}}"', _IP_FN, 'case "${SLURM_NODEID:?run under srun}" in', *branches,
            "*)", f'  echo "k3deploy: SLURM_NODEID=${{SLURM_NODEID}} is not one of the {len(specs)} ranks" >&2',
            "  exit 1", "  ;;", "esac"]
    return "\n".join(node) + "\n"


def node_count_guard(n: int) -> str:
    """The batch script's refusal to run in an allocation of another size."""
    return (f'[ "${{SLURM_JOB_NUM_NODES:?run under sbatch}}" = {n} ] || '
            f'{{ echo "k3deploy: rendered for {n} nodes, the job has ${{SLURM_JOB_NUM_NODES}}" >&2; exit 1; }}')


def job_text(inp: Inputs, vendor: VendorSpec | None, *, gpus: bool, wrap: Wrap | None = None,
             hold: bool = False) -> str:
    """The sbatch script for the topology; `wrap` (a launch's) runs each rank's body detached and logged;
    `hold` (a launch's) keeps the allocation once the engines' step ends, until k3deploy has stopped and read
    every node and cancels the job (steps can run only while the job does)."""
    t = inp.topology
    places_ = places(t)
    n = len(places_)
    lines = ["#!/bin/sh", *directives(t.name, n, t.launch.slurm, t.hardware.gpus_per_node if gpus else None),
             f"# k3deploy: deployment {t.name} on {n} node(s), one task each; a task's rank is its SLURM_NODEID",
             "# (read on the node, by srun's shell). Addresses come from the allocation: this script runs on",
             "# node 0, so rank 0's address (the head) is read here; each task reads its own. Secrets are",
             "# read on each node, never written here.",
             "set -eu",
             node_count_guard(n),
             _IP_FN, *_address(HEAD_IP_VAR, places_[0].iface, "the head (node 0, ${SLURMD_NODENAME:-this node})"),
             "# Expanded on each node by srun's shell, not here.",
             "# shellcheck disable=SC2016",
             f"K3_NODE_SCRIPT={shlex.quote(node_script(inp, vendor, wrap))}",
             (f"srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --kill-on-bad-exit=1 "
              'sh -c "${K3_NODE_SCRIPT}"' + (' || echo "k3deploy: the engines\' step ended with status $?" >&2'
                                             if hold else ""))]
    if hold:
        lines += ["# k3deploy cancels the job once it has stopped and read every node.",
                  "while :; do sleep 3600; done"]
    return "\n".join(lines) + "\n"
