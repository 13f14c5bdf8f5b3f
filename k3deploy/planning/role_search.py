"""`plan FILE --search --workload` on a topology with prefill/decode roles: every layout (a prefill shape and a
decode shape, each over its role's instance GPUs), ranked by its predicted output tok/s per GPU of both roles or
by TPOT, and why the top one wins.

Each role's shapes are the legal shapes of its instance's GPUs (planning/search.py), each planned as `plan` plans
that role's instance (the file's settings, only the role's `parallel` changed); a layout is then held to the
cross-role rules (planning/pd.py) and predicted as a service (planning/pd_prediction.py). What depends on one role
only (its instance's plan, its part of the prediction) is worked out once per shape and paired with every shape of
the other role. Pure."""
from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, TypeVar

from k3deploy.catalog.specs import Catalog
from k3deploy.engines.kinds import engine_family
from k3deploy.engines.shape import Shape
from k3deploy.errors import InputError
from k3deploy.planning.pd import cross_role_issues
from k3deploy.planning.pd_prediction import (
    DecodeRole,
    RolePrediction,
    prefill_role,
    roles_json,
    service,
)
from k3deploy.planning.perf_model import PerfUnknown, Term
from k3deploy.planning.plan import make_plan, unit_facts
from k3deploy.planning.ranking import Objective, contest, figure, parallel_name
from k3deploy.planning.search import legal_shapes
from k3deploy.planning.workload import Workload
from k3deploy.topology.loader import LoadedTopology
from k3deploy.topology.pd import ROLE_NAMES, role_group
from k3deploy.topology.schema import Topology

T = TypeVar("T")


class RoleShape(NamedTuple):
    """One shape of a role: its instance's topology laid out so, and the first error planning it (None: fits)."""

    shape: Shape
    topology: Topology
    error: str | None
    code: str = ""  # the error's code, named with the role


class RoleLayout(NamedTuple):
    """A prefill shape and a decode shape with the service's prediction (None when the layout does not fit or
    cannot be timed), whether it meets --tpot-max, and why not."""

    prefill: Shape
    decode: Shape
    feasible: bool
    prediction: RolePrediction | None
    meets_tpot: bool
    reason: str
    code: str = ""  # what refuses the layout: a role's issue code (`decode MEM_...`) or a cross-role one

    def model_dump(self) -> dict[str, Any]:
        """One `plan FILE --search --workload --json` layout."""
        return {"prefill": _shape_json(self.prefill), "decode": _shape_json(self.decode), "feasible": self.feasible,
                "code": self.code, "meets_tpot_max": self.meets_tpot, "reason": self.reason,
                "prediction": roles_json(self.prediction) if self.prediction is not None else None}


def _shape_json(s: Shape) -> dict[str, int]:
    return {"tp": s.tp, "ep": s.ep, "dp": s.dp, "pp": s.pp, "dcp": s.dcp, "attn_tp": s.attn_tp}


def layout_name(r: RoleLayout) -> str:
    """`prefill TP8/PP2, decode TP16/EP16/DCP16`."""
    return f"prefill {parallel_name(r.prefill)}, decode {parallel_name(r.decode)}"


def role_shapes(loaded: LoadedTopology, catalog: Catalog, role: str) -> list[RoleShape]:
    """Every legal shape of one instance of `role`, each planned as `plan` plans that instance."""
    t = loaded.topology
    model = catalog.models.get(t.model.id)
    if model is None:
        raise InputError(f"unknown model '{t.model.id}'", hint=f"known: {', '.join(catalog.models)}")
    inst = next(i for i in loaded.layout.instances if i.role == role)
    base = inst.topology
    per_node = t.hardware.gpus_per_node
    out = []
    for shape in legal_shapes(model, engine_family(t.engine.kind, getattr(t.engine, "mimic", None)),
                              gpus=len(inst.nodes) * per_node, nnodes=len(inst.nodes), gpus_per_node=per_node,
                              dcp_options=True):
        parallel = base.parallel.model_copy(update={"tp": shape.tp, "ep": shape.ep, "dp": shape.dp, "pp": shape.pp,
                                                    "dcp": shape.dcp, "attention_dp": shape.attention_dp})
        sub = base.model_copy(update={"parallel": parallel})
        error = next((i for i in make_plan(LoadedTopology.of(sub, loaded.source), catalog).issues
                      if i.severity == "error"), None)
        out.append(RoleShape(shape, sub, None, "") if error is None else
                   RoleShape(shape, sub, f"{role}: {error.message} [{error.code}]", f"{role} {error.code}"))
    return out


def _laid_out(t: Topology, pre: RoleShape, dec: RoleShape) -> Topology:
    """`t` with each role's parallel shape replaced by the layout's."""
    assert t.roles is not None
    return t.model_copy(update={"roles": t.roles.model_copy(update={
        "prefill": t.roles.prefill.model_copy(update={"parallel": pre.topology.parallel}),
        "decode": t.roles.decode.model_copy(update={"parallel": dec.topology.parallel})})})


def _key(objective: Objective, r: RoleLayout) -> tuple[Any, ...]:
    p = r.prediction
    if p is None:
        return (2, 0.0, 0.0)
    if objective == "throughput":
        return (0 if r.meets_tpot else 1, -p.output_throughput_per_gpu, p.tpot_s)
    # Unlike one deployment's search, a decode that holds fewer requests than its clients is not put last: the
    # benchmark run's TTFT already holds the requests it keeps waiting, and its TPOT is what such a run measures.
    return (0 if r.meets_tpot else 1, p.tpot_s, p.ttft_s if p.ttft_s is not None else math.inf)


def rank_layouts(rows: list[RoleLayout], objective: Objective) -> list[RoleLayout]:
    """The layouts best first for `objective`: those over --tpot-max after those under it, those that do not fit or
    cannot be timed last."""
    return sorted(rows, key=lambda r: _key(objective, r))


def search_layouts(loaded: LoadedTopology, catalog: Catalog, w: Workload,
                   tpot_max_ms: float | None = None) -> list[RoleLayout]:
    """Every prefill shape with every decode shape of `loaded`'s roles, each predicted for `w` where it fits (a
    role's plan and the cross-role rules), or with the reason it does not."""
    t = loaded.topology
    assert t.roles is not None
    shapes = {role: role_shapes(loaded, catalog, role) for role in ROLE_NAMES}
    groups = {role: role_group(t, role) for role in ROLE_NAMES}
    gpus = sum(len(g.nodes) for g in groups.values()) * t.hardware.gpus_per_node
    hybrid = bool(catalog.models[t.model.id].architecture.kda_layers)
    facts = unit_facts(loaded, catalog, shaped=False)  # whose PD transfer and the router's PD mode, for every pair
    pd_family = facts.layout.pd_family
    assert pd_family is not None  # a topology with roles
    # Each role's part of the prediction, once per shape that fits (a str: why it cannot be timed).
    pre_parts = {s.shape: _timed(partial(prefill_role, s.topology, catalog, w, groups["prefill"].instances))
                 for s in shapes["prefill"] if s.error is None}
    dec_parts = {s.shape: _timed(partial(DecodeRole, s.topology, catalog, w, groups["decode"].instances))
                 for s in shapes["decode"] if s.error is None}
    out = []
    for pre in shapes["prefill"]:
        for dec in shapes["decode"]:
            refused = next((s for s in (pre, dec) if s.error is not None), None)
            if refused is not None:
                out.append(RoleLayout(pre.shape, dec.shape, False, None, False, refused.error or "", refused.code))
                continue
            cross = next((i for i in cross_role_issues(_laid_out(t, pre, dec), hybrid, pd_family, facts.router_pd)
                          if i.severity == "error"), None)
            if cross is not None:
                out.append(RoleLayout(pre.shape, dec.shape, False, None, False, f"{cross.message} [{cross.code}]",
                                      cross.code))
                continue
            p, d = pre_parts[pre.shape], dec_parts[dec.shape]
            got = p if isinstance(p, str) else d if isinstance(d, str) else _timed(partial(service, p, d, gpus))
            if isinstance(got, str):
                out.append(RoleLayout(pre.shape, dec.shape, True, None, False, got))
                continue
            meets = tpot_max_ms is None or got.tpot_s * 1000 <= tpot_max_ms
            reason = "" if meets else f"TPOT {got.tpot_s * 1000:,.1f} ms > --tpot-max {tpot_max_ms:g}"
            out.append(RoleLayout(pre.shape, dec.shape, True, got, meets, reason))
    return out


def _timed(make: Callable[[], T]) -> T | str:
    """What `make` works out, or why the model cannot time it."""
    try:
        return make()
    except PerfUnknown as exc:
        return str(exc)


def why_top_layout(rows: list[RoleLayout], objective: Objective) -> str:
    """Why the first layout wins over the runner-up: the figures, and the term that differs most."""
    got = contest(rows, objective, "layout", layout_name)
    if isinstance(got, str):
        return got
    top, runner = got
    p, q = top.prediction, runner.prediction
    assert p is not None and q is not None
    mine, theirs = _terms(p), _terms(q)
    name = max(mine, key=lambda k: abs(mine[k] - theirs.get(k, 0.0)))
    return (f"{layout_name(top)} wins with {figure(objective, p)} against {figure(objective, q)} for "
            f"{layout_name(runner)}: its {name} takes {mine[name] * 1000:,.2f} ms against "
            f"{theirs.get(name, 0.0) * 1000:,.2f}; its output rate is bound by {p.bound('output_throughput')}")


def _terms(p: RolePrediction) -> dict[str, float]:
    """Seconds of each TPOT term (per output token) and of one prompt's prefill."""
    prefill: tuple[Term, ...] = p.ttft_terms[:1]
    return {t.name: t.seconds for t in (*p.tpot_terms, *prefill)}
