"""The stand-in's own pacing (sim/pacing.py, built as a stand-in node builds it from its rendered command) and
the planner's performance model agree on the stand-in's hardware, so a bug in either shows as a disagreement.

Stated tolerance: 2% on a decode step and on a prefill. The two are written apart on purpose; both count a
prefill's MLA attention FLOPs (a prefill of n tokens attends to n/2 on average), which is 8% of the stand-in's
prefill at 512 tokens and 42% at 4,096, so a calibrated prefill factor carries from one prompt length to another.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.render import render_nodes
from k3deploy.planning.files import plan_path
from k3deploy.planning.perf_model import decode_step, prefill
from k3deploy.planning.prediction import perf_inputs, predict
from k3deploy.planning.workload import Workload
from k3deploy.sim.engine_args import parse_engine_args
from k3deploy.sim.faults import Faults
from k3deploy.sim.log_format import EngineLog
from k3deploy.sim.model_info import config_for, hardware, model_spec
from k3deploy.sim.pacing import PerfModel, speed_factor
from k3deploy.sim.serve import Node
from k3deploy.sim.serve_config import resolve_config

pytestmark = pytest.mark.timeout(60)
DECODE_TOLERANCE = 0.02
PREFILL_TOLERANCE = 0.02
DEMO = Path("topologies/local-demo.yaml")


def stand_in(speed: str | None) -> tuple[PerfModel, object]:
    """Rank 0 of the demo deployment as the stand-in paces it, and the planner's inputs for the same file."""
    cat = load_catalog()
    plan = plan_path(DEMO, cat).plan
    assert plan is not None and plan.feasible
    if speed is not None:
        engine = plan.topology.engine.model_copy(update={"env": {"K3SIM_SPEED": speed}})
        plan = plan._replace(topology=plan.topology.model_copy(update={"engine": engine}))
    spec = render_nodes(plan.render_inputs())[0]
    argv = list(spec.argv[spec.argv.index("serve") + 1:])
    env = {**spec.env, **plan.topology.engine.env}
    cfg = resolve_config("sglang", parse_engine_args("sglang", argv), env)
    model = model_spec(config_for(cat.models[plan.topology.model.id]))
    node = Node(cfg, model, hardware(env), Faults(), EngineLog("sglang", ranks=(0,)), speed=speed_factor(env))
    return node.perf, perf_inputs(plan, cat)


def close(a: float, b: float, tolerance: float = DECODE_TOLERANCE) -> bool:
    return abs(a - b) <= tolerance * max(a, b)


@pytest.mark.parametrize("speed", [None, "4"])
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("context", [256, 4096])
def test_decode_step_agrees(speed: str | None, batch: int, context: int) -> None:
    sim, inp = stand_in(speed)
    planner = decode_step(inp, batch, context)  # type: ignore[arg-type]
    theirs = sim.step_s(batch, batch * context)
    assert close(planner.seconds, theirs), (planner.seconds, theirs, planner.terms)
    assert planner.bound == "HBM reads"


@pytest.mark.parametrize("speed", [None, "4"])
@pytest.mark.parametrize("tokens", [64, 512, 4096])
def test_prefill_agrees(speed: str | None, tokens: int) -> None:
    sim, inp = stand_in(speed)
    planner = prefill(inp, tokens)  # type: ignore[arg-type]
    theirs = sim.prefill_s(tokens)
    assert close(planner.seconds, theirs, PREFILL_TOLERANCE), (planner.seconds, theirs, planner.terms)


def test_workload_tpot_is_the_stand_ins_step_at_that_batch() -> None:
    """The stand-in decodes beside a prefill, so its TPOT is its step at the wave's batch: no stall term."""
    sim, inp = stand_in(None)
    w = Workload(input_tokens=256, output_tokens=128, concurrency=4)
    p = predict(inp, w)  # type: ignore[arg-type]
    assert close(p.tpot_s, sim.step_s(4, 4 * (256 + 64)))
    assert next(t for t in p.tpot_terms if t.name == "prefill stalls").seconds == 0.0
    # One prefill, and half the queue ahead for the first wave (4 of the 20 prompts) only: the later requests
    # arrive as earlier ones finish, a prefill apart, and find the prefill free.
    assert close(p.ttft_s, sim.prefill_s(256) * (1 + 4 / 20 * (4 - 1) / 2), PREFILL_TOLERANCE)
    first = predict(inp, w._replace(num_prompts=4))  # type: ignore[arg-type]
    assert close(first.ttft_s, sim.prefill_s(256) * (1 + (4 - 1) / 2), PREFILL_TOLERANCE)


def test_prefill_bound_stand_in_queues_every_request_and_decodes_beside_the_prefills() -> None:
    """Long prompts and short answers: the prefills are the bound, so a later request waits out its slot's turn
    (4 prefills less its own decode) and the run lasts the prefills, not prefills + decodes per wave."""
    sim, inp = stand_in(None)
    w = Workload(input_tokens=4096, output_tokens=4, concurrency=4, num_prompts=40)
    p = predict(inp, w)  # type: ignore[arg-type]
    gap = p.prefill.seconds
    assert close(gap, sim.prefill_s(4096), PREFILL_TOLERANCE)
    later = 4 * gap - 3 * p.decode_step_s
    assert close(p.ttft_s, 0.1 * (gap + 1.5 * gap) + 0.9 * later, PREFILL_TOLERANCE)
    assert close(p.output_throughput, 40 * 4 / (p.wave_s + 9 * 4 * gap), PREFILL_TOLERANCE)
    assert p.output_throughput > 4 * 4 / p.wave_s  # more than a wave's worth: the decode hides under prefills
