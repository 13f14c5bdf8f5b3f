"""Software-stack checks: accelerators (vendor tools), driver/toolkit versions, the engine, Ray/Python."""
from __future__ import annotations

import json
from typing import Any

from k3deploy.engines.kinds import engine_flavour
from k3deploy.preflight import accelerators as acc
from k3deploy.preflight.context import Check, Context, Judged, agree, judged_or, per_node
from k3deploy.preflight.report import Verdict

GIB = 2**30
# Memory in use beyond the runtime's own idle share (the catalog's memory_gib - usable_gib: ~0.5 GiB on NVIDIA,
# ~3 GiB of CANN runtime on Ascend, where an idle A3 die shows 3.1-3.4 GB used) plus this share of the
# total means another process holds it.
MAX_USED_SHARE = 0.05


def inventory(ctx: Context, f: dict[str, Any]) -> acc.Inventory | str:
    """The node's parsed inventory, or why there is none."""
    tools = f.get("tools", {})
    for name in acc.TOOL_OF_VENDOR.get(ctx.vendor, ()):
        if name in tools:
            runs = tools[name]
            if runs[0]["exit"] != 0:
                return f"{acc.TOOL_QUERIES[name][0][0]} failed: {(runs[0]['err'] or runs[0]['out']).strip()[:200]}"
            try:
                return acc.PARSERS[name]([r["out"] if r["exit"] == 0 else "" for r in runs])
            except acc.ParseError as exc:
                return str(exc)
    wanted = " or ".join(acc.TOOL_QUERIES[n][0][0] for n in acc.TOOL_OF_VENDOR.get(ctx.vendor, ()))
    return f"no {wanted} on the node's PATH"


def _sim(ctx: Context) -> tuple[Verdict, ...] | None:
    if ctx.vendor not in ("sim", "cpu"):
        return None
    return per_node(ctx, lambda r, f: ("skip", f"hardware is {ctx.vendor}: no accelerators or vendor tool to ask",
                                       ""))


def _accelerators(ctx: Context) -> tuple[Verdict, ...]:
    skipped = _sim(ctx)
    if skipped is not None:
        return skipped
    hw, want = ctx.plan.hardware, ctx.plan.topology.hardware.gpus_per_node
    assert hw is not None

    def judge(rank: int, f: dict[str, Any]) -> Judged:
        inv = inventory(ctx, f)
        if isinstance(inv, str):
            return ("fail", inv, f"install the {ctx.vendor} driver and put its tool on PATH")
        if len(inv.gpus) < want:
            return ("fail", f"{len(inv.gpus)} accelerators, hardware.gpus_per_node is {want}",
                    "fix hardware.gpus_per_node or the node's devices")
        wrong = [g for g in inv.gpus if not acc.model_matches(hw.id, hw.name, g.name)]
        if wrong:
            return ("fail", f"accelerator {wrong[0].index} is {wrong[0].name}, hardware.gpu is {hw.id} ({hw.name})",
                    "fix hardware.gpu or run on the right nodes")
        idle_bytes = max(0.0, hw.memory_gib - hw.usable_gib) * GIB
        busy = [g for g in inv.gpus[:want] if g.memory_total_bytes and
                g.memory_used_bytes > idle_bytes + MAX_USED_SHARE * g.memory_total_bytes]
        if inv.processes or busy:
            what = "; ".join(inv.processes) or f"accelerator {busy[0].index} has " \
                                                f"{busy[0].memory_used_bytes / GIB:.1f} GiB in use"
            return ("fail", f"accelerator memory is in use: {what}", "stop the other processes on this node")
        return ("pass", f"{len(inv.gpus)} x {inv.gpus[0].name if inv.gpus else '?'}", "")

    return per_node(ctx, judge)


def _driver_versions(ctx: Context) -> tuple[Verdict, ...]:
    skipped = _sim(ctx)
    if skipped is not None:
        return skipped
    invs = {r: inventory(ctx, f) for r, f in ctx.facts.items()}
    stacks = {r: f"{i.driver}" + (f" / toolkit {i.toolkit}" if i.toolkit else "")
              for r, i in invs.items() if isinstance(i, acc.Inventory)}
    return per_node(ctx, judged_or(agree(stacks, "driver"), ("skip", "no inventory (see accelerators)", "")))


def engine_answer(f: dict[str, Any]) -> dict[str, Any] | str:
    """The engine probe's JSON, or why there is none."""
    run = f.get("engine")
    if run is None:
        return "not asked"
    if run["exit"] != 0:
        return f"the engine's python could not run: {(run['err'] or run['out']).strip()[-300:]}"
    try:
        answer: dict[str, Any] = json.loads(run["out"].strip().splitlines()[-1])
        return answer
    except (ValueError, IndexError):
        return f"the engine's python printed no answer: {run['out'][-200:]!r}"


def release(version: str) -> str:
    """The public release of a PEP 440 version: a local label (`0.32.0+cpu`, a build of the same source
    for CPU) names the same release as `0.32.0`."""
    return version.split("+", 1)[0]


def expected_engine_version(ctx: Context) -> str | None:
    """engine.version, else the catalog's pinned version of the engine the command line is for."""
    e = ctx.plan.topology.engine
    if e.version:
        return e.version
    spec = ctx.catalog.engines.get(engine_flavour(e, ctx.vendor))
    return getattr(spec, "version", None)


def _image(ctx: Context) -> tuple[Verdict, ...]:
    """Container engines: the image exists on every node with the same digest."""
    image = ctx.plan.topology.engine.image
    runs = {r: (f.get("tools", {}).get("docker") or [None])[0] for r, f in ctx.facts.items()}
    digests = {r: run["out"].strip() for r, run in runs.items() if run and run["exit"] == 0}
    judged = agree(digests, f"image {image} is")

    def judge(rank: int, f: dict[str, Any]) -> Judged:
        run = runs[rank]
        if run is None:
            return ("fail", "no docker on the node's PATH", "install docker (engine.image runs the engine in it)")
        if run["exit"] != 0:
            return ("fail", f"image {image} is not on the node: {run['err'].strip()[:200]}",
                    f"docker pull {image} on every node before launch")
        return judged[rank]

    return per_node(ctx, judge)


def _engine(ctx: Context) -> tuple[Verdict, ...]:
    if ctx.plan.topology.engine.image:
        return _image(ctx)
    answers = {r: engine_answer(f) for r, f in ctx.facts.items()}
    want = expected_engine_version(ctx)
    versions = agree({r: a.get("version") for r, a in answers.items() if isinstance(a, dict)}, "version", want,
                     key=release)
    fix_version = f"install {ctx.plan.topology.engine.kind} {want} on every node (or set engine.version)"

    def judge(rank: int, f: dict[str, Any]) -> Judged:
        a = answers[rank]
        if isinstance(a, str):
            return ("fail", a, "set engine.launcher to the engine's interpreter or console script")
        if a["error"]:
            return ("fail", f"{a['executable']} cannot load the engine: {a['error']}",
                    "install the engine for that interpreter (or point engine.launcher at the right one)")
        status, detail, _ = versions.get(rank, ("fail", "no version", ""))
        if status == "fail":
            return ("fail", f"engine {detail}", fix_version)
        archs = f["checkpoint"]["architectures"]
        if archs and not a["known_archs"]:
            return ("fail", f"the engine has no model class for {', '.join(archs)} (an image without K3 support)",
                    "use a K3-enabled engine build")
        return ("pass", f"{detail}; knows {', '.join(a['known_archs'] or ['?'])}", "")

    return per_node(ctx, judge)


def _ray_python(ctx: Context) -> tuple[Verdict, ...]:
    if not ctx.ray_runtime:
        return per_node(ctx, lambda r, f: ("skip", "not launched through Ray", ""))
    answers = {r: engine_answer(f) for r, f in ctx.facts.items()}
    stacks = {r: f"Python {a['python']}, Ray {a['ray']}" for r, a in answers.items() if isinstance(a, dict)}
    judged = agree(stacks, "the engine interpreter runs")
    return per_node(ctx, judged_or(judged, ("fail", "the engine's interpreter did not answer (see engine)", "")))


STACK_CHECKS = (
    Check("accelerators", "Accelerators", "nvidia-smi --query-gpu CSV / amd-smi or rocm-smi JSON / npu-smi: count, "
          "model, memory in use, processes", _accelerators),
    Check("driver", "Driver", "driver and CUDA/ROCm/CANN versions equal on every node", _driver_versions),
    Check("engine", "Engine", "the engine's interpreter: engine version (= engine.version on every node), "
          "its model registry knows the checkpoint's architecture; with engine.image: the image digest "
          "(docker image inspect) equal on every node", _engine),
    Check("ray", "Ray/Python", "Ray and Python versions of the engine's interpreter equal on every node (Ray only)",
          _ray_python),
)
