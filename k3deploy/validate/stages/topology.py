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
from k3deploy.validate.logscan import every_match, last_match, node_result, row
from k3deploy.validate.stage import NodeRow, StageResult, ValidateContext
from k3deploy.validate.stages.kernels import family_of

Ranks = tuple[int, int, int, int]  # dp, pp, tp, ep of one GPU
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


def node_ranks(shape: Shape, family: Family, node: int) -> set[Ranks]:
    """(dp, pp, tp, ep) of every GPU the plan puts on a node (GPUs numbered node by node, TP fastest)."""
    out = set()
    for local in range(shape.gpus_per_node):
        world = node * shape.gpus_per_node + local
        tp = world % shape.tp
        pp = (world // shape.tp) % shape.pp
        if family == "sglang":  # EP groups split the TP group; attention DP groups too
            dp = tp // (shape.tp // shape.dp) if shape.attention_dp else 0
            ep = tp // max(shape.tp // shape.ep, 1)
        else:  # vLLM: DP replicas side by side, EP spans TP x DP
            dp = world // (shape.tp * shape.pp)
            ep = dp * shape.tp + tp if shape.ep > 1 else 0
        out.add((dp, pp, tp, ep))
    return out


def _fmt(ranks: Ranks) -> str:
    return "DP{} PP{} TP{} EP{}".format(*ranks)


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
        shown = ", ".join(f"{k}: {args[k]!r}" for k in (*VLLM_KEYS, "enable_expert_parallel") if k in args)
        evidence.append(f"rank 0's non-default args: {{{shown}}}")
    got = {field: int(args.get(key) or 1) for key, field in VLLM_KEYS.items()}
    world = last_match(lines, [patterns.world]) if patterns.world is not None else None
    if world is not None:
        got["world_size"] = int(world.group("world"))
        evidence.append(world.evidence)
    experts = last_match(lines, [patterns.experts]) if patterns.experts is not None else None
    got["ep"] = int(experts.group("ep")) if experts is not None else 1
    got["experts_per_rank"] = int(experts.group("local")) if experts is not None else num_experts
    evidence.append(experts.evidence if experts is not None else "no [EP Rank] line: expert parallelism is off")
    return got, "\n".join(evidence) or "rank 0 logged no arguments"


def _node_row(ctx: ValidateContext, rank: int, host: str, text: str, shape: Shape, family: Family,
              patterns: LogLines) -> NodeRow:
    if not text.strip():
        return row(rank, host, [], "", "its engine log is empty or could not be read")
    seen: dict[Ranks, str] = {}
    for found in every_match(text.splitlines(), patterns.rank_prefix):
        key = (int(found.group("dp")), int(found.group("pp")), int(found.group("tp")), int(found.group("ep")))
        seen.setdefault(key, found.evidence)
    expected = node_ranks(shape, family, sorted(n.rank for n in ctx.nodes).index(rank))
    want = ", ".join(_fmt(r) for r in sorted(expected, key=lambda r: r[2]))
    if not seen:
        return row(rank, host, [f"no line carries the rank prefix (the plan puts {want} here)"], "")
    wrong = sorted(set(seen) - expected)
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
        problems = [f"{field}: the engine reports {got[field]}, the plan says {planned[field]}"
                    for field in FIELDS if field in got and got[field] != planned[field]]
        if not got:
            problems.append(f"rank 0 reported no parallel sizes ({evidence})")
        if problems:
            problems[-1] += f"; evidence: {evidence}"
        rows = [_node_row(ctx, n.rank, n.host, logs.get(n.rank, ""), shape, family, patterns) for n in ctx.nodes]
        summary = ", ".join(f"{f}={planned[f]}" for f in FIELDS)
        detail = f"as planned: {summary} ({experts} experts)"
        evidence += "\n" + "\n".join(f"node {r.rank} ({r.host}): {r.detail}" for r in rows)
        return node_result(self.name, rows, detail, evidence, problems)
