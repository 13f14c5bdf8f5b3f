"""Stage `kernels`: every node's start-up log names the MoE and attention kernels this accelerator needs for
K3 (the renderers' table, k3deploy.engines.kernels), and no line says the experts fell back or were upcast."""
from __future__ import annotations

from dataclasses import dataclass

from k3deploy.catalog.specs import Catalog, HardwareSpec
from k3deploy.engines.kernels import KernelNeeds, kernel_needs
from k3deploy.engines.kinds import Family, engine_family
from k3deploy.engines.log_lines import LogLines, ascend_graph_lines, log_lines
from k3deploy.errors import InputError
from k3deploy.validate import reach
from k3deploy.validate.logscan import last_match, node_result, row
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.verdicts.model import NodeRow

KIND_WORDS = {"marlin": "Marlin W4A16", "native_mxfp4": "native MXFP4", "upcast": "experts upcast to BF16",
              "unquantized": "unquantized experts"}


def catalog_of(ctx: ValidateContext) -> Catalog:
    """The catalog the topology was checked against."""
    from k3deploy.catalog.loader import load_catalog

    return ctx.catalog if ctx.catalog is not None else load_catalog()


def hardware_of(ctx: ValidateContext) -> HardwareSpec:
    """The topology's accelerator (InputError when the catalog lacks it)."""
    catalog = catalog_of(ctx)
    gpu = ctx.topology.hardware.gpu
    if gpu not in catalog.hardware:
        raise InputError(f"hardware.gpu {gpu!r} is not in the catalog (known: {', '.join(sorted(catalog.hardware))})")
    return catalog.hardware[gpu]


def family_of(ctx: ValidateContext) -> Family:
    """sglang | vllm: whose API fields and log lines the deployment's engine has (the stand-in: its mimic)."""
    return engine_family(ctx.topology.engine.kind, getattr(ctx.topology.engine, "mimic", None))


@dataclass(frozen=True)
class NodeKernels:
    """What one node's log says about its kernels."""

    problems: list[str]
    seen: list[str]  # the deciding lines
    summary: str


def read_kernels(text: str, patterns: LogLines, needs: KernelNeeds, dense: bool = False) -> NodeKernels:
    """Judge one node's start-up log against what the accelerator needs (a dense model runs no MoE kernel)."""
    lines = text.splitlines()
    problems: list[str] = []
    seen: list[str] = []
    for pattern in patterns.fallback:
        problems += [f"fallback: {line.strip()}" for line in lines if pattern.search(line)]
    marlin = last_match(lines, patterns.marlin_warning)
    if marlin is not None and needs.moe == "native_mxfp4":
        problems.append(f"Marlin weight-only FP4 on a GPU with FP4 cores ({needs.reason}): {marlin.evidence}")
    moe = None if dense else last_match(lines, patterns.moe)
    moe_name = moe.group("name") if moe is not None else ""
    if dense:
        kind = "dense"
    elif moe is None:
        kind = "marlin" if marlin is not None else ""
        if needs.moe is not None and not kind:
            problems.append(f"no line names the MoE kernel ({len(lines)} log lines read)")
    else:
        seen.append(moe.evidence)
        # The backend oracle's line names the experts' quantization beside the backend.
        kind = "unquantized" if moe.group("quant").lower() == "unquantized" else patterns.moe_kind(moe_name)
        if needs.moe == "native_mxfp4" and moe_name.lower() == "auto":  # resolves per GPU, and says so
            problems.append(f"no line says which MoE kernel 'auto' resolved to: {moe.evidence}")
        elif needs.moe is not None and kind != needs.moe:
            problems.append(f"MoE kernel {moe_name} ({KIND_WORDS[kind]}), needs {KIND_WORDS[needs.moe]}: "
                            f"{needs.reason}; evidence: {moe.evidence}")
    attention = last_match(lines, patterns.attention)
    att_name = attention.group("name") if attention is not None else ""
    if attention is not None:
        seen.append(attention.evidence)
    if needs.attention is not None and attention is None:
        problems.append(f"no line names the attention backend, needs {needs.attention} ({len(lines)} log lines read)")
    elif needs.attention is not None and att_name.lower() != needs.attention:
        assert attention is not None
        problems.append(f"attention backend {att_name}, needs {needs.attention}; evidence: {attention.evidence}")
    moe_words = "no MoE kernel (a dense model)" if dense else f"MoE {moe_name or '?'} ({KIND_WORDS.get(kind, 'unknown')})"
    summary = f"{moe_words}, attention {att_name or 'not logged'}"
    if needs.graph is not None:
        graph = read_graph(lines, needs)
        problems += graph.problems
        seen += graph.seen
        summary = f"{summary}, {graph.summary}"
    return NodeKernels(problems, seen, summary)


def read_graph(lines: list[str], needs: KernelNeeds) -> NodeKernels:
    """vLLM-Ascend: decode runs in the ACL graphs the render asks for, not eagerly (a line says so)."""
    patterns = ascend_graph_lines()
    fix = ("drop --enforce-eager from engine.args and keep --compilation-config "
           f"'{{\"cudagraph_mode\":\"{needs.graph}\"}}' (k3deploy renders it)")
    eager = [line.strip() for line in lines if any(p.search(line) for p in patterns.off)]
    if eager:
        return NodeKernels([f"decode runs eagerly, needs {needs.graph} ACL graphs: {eager[-1]}; {fix}"],
                           [eager[-1]], "ACL graphs off")
    captured = last_match(lines, (patterns.captured,))
    if captured is None:
        missing = (f"no line says the ACL graphs were captured ({len(lines)} log lines read; "
                   f"{patterns.version} logs 'Graph capturing finished in N secs')")
        return NodeKernels([missing], [], "ACL graphs ?")
    return NodeKernels([], [captured.evidence], f"ACL graphs captured in {captured.group('secs')} s")


class KernelsStage:
    """MoE and attention kernels from every node's start-up log."""

    name = "kernels"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """Read every node's log and judge it."""
        hw = hardware_of(ctx)
        family = family_of(ctx)
        needs = kernel_needs(hw, family, ctx.topology.parallel.dcp)
        dense = ctx.model.architecture.num_experts == 0
        if dense and needs.moe is not None:  # the MoE rule is K3's; a dense model has no experts to judge
            needs = KernelNeeds(None, needs.attention, f"{ctx.model.id} is dense: no MoE kernel applies")
        patterns = log_lines(family)
        logs = reach.node_logs(ctx)
        rows: list[NodeRow] = []
        evidence = ""
        for node in ctx.nodes:
            text = logs.get(node.rank, "")
            if not text.strip():
                rows.append(row(node.rank, node.host, [], "", "its engine log is empty or could not be read"))
                continue
            found = read_kernels(text, patterns, needs, dense)
            rows.append(row(node.rank, node.host, found.problems, found.summary))
            if not evidence and found.seen:
                evidence = f"node {node.rank} ({node.host}): " + "\n".join(found.seen)
        graph = needs.graph and f"{needs.graph} ACL graphs"
        wanted = " + ".join(x for x in (needs.moe and KIND_WORDS[needs.moe], needs.attention, graph) if x) \
            or needs.reason
        passed = f"{len(rows)} nodes on {hw.id}: {rows[0].detail if rows else ''} (needs {wanted}; {patterns.version})"
        return node_result(self.name, rows, passed, evidence)
