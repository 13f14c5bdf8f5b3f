"""What every check judges from: the plan, each node's inputs and raw facts, and two helpers that turn a
per-node judgement or a cross-node comparison into verdicts."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from k3deploy.catalog.specs import Catalog
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.preflight.report import CheckResult, Status, Verdict

# (status, detail, fix) for one node
Judged = tuple[Status, str, str]


@dataclass
class Context:
    """Inputs of every check; `facts` holds the JSON the node probe printed, `errors` why a node has none."""

    plan: Plan
    catalog: Catalog
    nodes: dict[int, NodeJob]
    ray_runtime: bool = False  # the nodes run commands as Ray workers (the executor's capability)
    facts: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    # rank -> (this machine's clock before the probe ran, after it returned)
    clock: dict[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def vendor(self) -> str:
        """The accelerator vendor of the plan ('sim' for the stand-in)."""
        return self.plan.hardware.vendor if self.plan.hardware else "sim"

    def host(self, rank: int) -> str:
        """The node's host as the topology names it."""
        return self.nodes[rank].host


def per_node(ctx: Context, judge: Callable[[int, dict[str, Any]], Judged]) -> tuple[Verdict, ...]:
    """`judge(rank, facts)` on every node that has facts; an error verdict for those that do not."""
    out = []
    for rank in sorted(ctx.nodes):
        if rank in ctx.errors:
            out.append(Verdict(rank=rank, host=ctx.host(rank), status="error",
                               detail=f"not checked: {ctx.errors[rank]}"))
            continue
        status, detail, fix = judge(rank, ctx.facts[rank])
        out.append(Verdict(rank=rank, host=ctx.host(rank), status=status, detail=detail, fix=fix))
    return tuple(out)


def agree(values: Mapping[int, str | None], what: str, expected: str | None = None,
          key: Callable[[str], str] = str) -> dict[int, Judged]:
    """Nodes whose value differs from `expected` (when given) or from the most common value fail, each
    told what the others have; nodes without a value are left out (their own check says why). `key` says
    which values are the same (an engine release with or without a local label)."""
    known = {r: v for r, v in values.items() if v is not None}
    if not known:
        return {}
    common = Counter(key(v) for v in known.values()).most_common(1)[0][0]
    want = expected if expected is not None else common
    out: dict[int, Judged] = {}
    for rank, v in known.items():
        if key(v) == key(want):
            out[rank] = ("pass", f"{what} {v}", "")
            continue
        others = sorted({o for r, o in known.items() if r != rank})
        versus = f"expected {want}" if expected is not None else f"the other nodes have {', '.join(others)}"
        out[rank] = ("fail", f"{what} {v}; {versus}", f"make {what} the same on every node ({want})")
    return out


def judged_or(judged: Mapping[int, Judged], default: Judged) -> Callable[[int, dict[str, Any]], Judged]:
    """A per-node judge reading a precomputed cross-node judgement, `default` for nodes it left out."""
    return lambda rank, _facts: judged.get(rank, default)


@dataclass(frozen=True)
class Check:
    """One named check: what it asks each node, and the judgement (parsing included) over all of them."""

    name: str
    title: str
    asks: str
    judge: Callable[[Context], tuple[Verdict, ...]]

    def run(self, ctx: Context) -> CheckResult:
        """The verdicts (the runner times the check)."""
        return CheckResult(name=self.name, title=self.title, asks=self.asks, verdicts=self.judge(ctx))
