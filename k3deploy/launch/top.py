"""`top`: a running unit's engines read from their own `/metrics` (every instance, and the router's page), each
window's figures beside what the planner predicts for that load, and which instance lags the others."""
from __future__ import annotations

import functools
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from k3deploy.engines.engine_metrics import Sample, figures, parse_sample
from k3deploy.errors import ExecError
from k3deploy.executors.http import NodeHttp

# A scrape never waits longer than this on one engine, and `top` scrapes each engine at most this often:
# /metrics renders every family under the engine's lock, so a tight loop would slow what it watches.
SCRAPE_TIMEOUT_S = 2.0
MIN_INTERVAL_S = 1.0
# An instance lags when its TPOT (or TTFT) is this many times the median of the others', or its share of the
# prediction's speed falls below 1 / LAG_FACTOR.
LAG_FACTOR = 1.5


class Source(BaseModel):
    """One engine page `top` scrapes: an instance's serving URL, or the router's."""

    model_config = ConfigDict(frozen=True)

    label: str  # the instance's deployment name, or "router"
    url: str
    kind: str  # instance | router
    file: str = ""  # the topology the instance was launched from (its prediction), "" for the router
    unreachable: str = ""  # why it cannot be scraped from here, when known before trying


class Predicted(BaseModel):
    """What the planner predicts for an instance at the load it is seen under."""

    model_config = ConfigDict(frozen=True)

    concurrency: int
    input_tokens: int
    output_tokens: int
    generated_tok_s: float
    ttft_ms: float
    tpot_ms: float
    capacity_running: int  # the most requests it runs at once, as `plan` sizes its caches
    capacity_tok_s: float  # its generated tok/s with that many running
    band: str = ""


class Row(BaseModel):
    """One source over the last window: its figures, or why there are none (never a stale figure)."""

    model_config = ConfigDict(frozen=True)

    label: str
    kind: str
    url: str
    missing: str = ""  # why this source has no figures now
    window_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_use: float | None = None
    prefix_hit_rate: float | None = None
    generated_tok_s: float | None = None
    requests_done: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    predicted: Predicted | None = None
    prediction_note: str = ""  # why no prediction is shown
    lag: str = ""  # how this instance lags the others and the prediction


class TopReport(BaseModel):
    """`k3deploy top` of a unit (also its `--once --json`)."""

    model_config = ConfigDict(frozen=True)

    name: str
    at: float
    window_s: float
    rows: tuple[Row, ...]


Scrape = Callable[[str], str]  # URL -> the /metrics text; raises ExecError with why not


def scrape_metrics(url: str) -> str:
    """One engine's /metrics text, within SCRAPE_TIMEOUT_S."""
    with NodeHttp(url, timeout_s=SCRAPE_TIMEOUT_S) as http:
        reply = http.get("/metrics", SCRAPE_TIMEOUT_S)
    if not reply.ok:
        raise ExecError(f"/metrics: HTTP {reply.status}")
    return reply.text


Predict = Callable[[str, int, int, int], "Predicted | str"]  # (file, concurrency, in, out) -> prediction | why not


@dataclass
class Watch:
    """Samples of each source kept for one window, and the report they make."""

    name: str
    sources: list[Source]
    window_s: float
    scrape: Scrape = scrape_metrics
    predict: Predict | None = None
    clock: Callable[[], float] = time.monotonic
    samples: dict[str, deque[Sample]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def poll(self) -> None:
        """Scrape every source once; a source that fails loses its samples (no stale window survives it)."""
        for s in self.sources:
            if s.unreachable:
                self.errors[s.label] = s.unreachable
                continue
            try:
                text = self.scrape(s.url)
            except ExecError as exc:
                self.errors[s.label] = f"{s.url}/metrics: {exc}"
                self.samples.pop(s.label, None)
                continue
            self.errors.pop(s.label, None)
            kept = self.samples.setdefault(s.label, deque())
            kept.append(parse_sample(text, self.clock()))
            while len(kept) > 2 and kept[-1].at_s - kept[1].at_s >= self.window_s:
                kept.popleft()

    def report(self) -> TopReport:
        """Each source's figures over its window, predictions beside them, and the laggards named."""
        rows = [self._row(s) for s in self.sources]
        return TopReport(name=self.name, at=time.time(), window_s=self.window_s, rows=tuple(mark_lagging(rows)))

    def _row(self, s: Source) -> Row:
        if s.label in self.errors:
            return Row(label=s.label, kind=s.kind, url=s.url, missing=self.errors[s.label])
        kept = self.samples.get(s.label)
        if not kept or len(kept) < 2:
            return Row(label=s.label, kind=s.kind, url=s.url, missing="waiting for a second scrape")
        f = figures(kept[0], kept[-1])
        row = Row(label=s.label, kind=s.kind, url=s.url, **f._asdict())
        if s.kind != "instance" or self.predict is None or not s.file:
            return row
        if not f.input_tokens or not f.output_tokens:
            return row.model_copy(update={"prediction_note": "no request finished in the window"})
        got = self.predict(s.file, max(1, round(f.running or 0)), round(f.input_tokens), round(f.output_tokens))
        if isinstance(got, str):
            return row.model_copy(update={"prediction_note": got})
        return row.model_copy(update={"predicted": got})


def mark_lagging(rows: list[Row]) -> list[Row]:
    """Rows with `lag` set on each instance whose TPOT or TTFT is LAG_FACTOR times the others' median, or whose
    decode falls that far below its prediction."""
    out = []
    for row in rows:
        if row.kind != "instance" or row.missing:
            out.append(row)
            continue
        why = []
        for metric, value in (("TPOT", row.tpot_ms), ("TTFT", row.ttft_ms)):
            others = [getattr(o, f"{metric.lower()}_ms") for o in rows
                      if o is not row and o.kind == "instance" and not o.missing]
            others = [v for v in others if v]
            if value and others and value >= LAG_FACTOR * (median := statistics.median(others)):
                why.append(f"{metric} {value / median:.1f}x the others' ({value:,.1f} vs {median:,.1f} ms)")
        p = row.predicted
        if p is not None and row.tpot_ms and row.tpot_ms >= LAG_FACTOR * p.tpot_ms:
            why.append(f"TPOT {row.tpot_ms / p.tpot_ms:.1f}x the predicted {p.tpot_ms:,.1f} ms")
        out.append(row.model_copy(update={"lag": "; ".join(why)}) if why else row)
    return out


@functools.lru_cache(maxsize=256)
def plan_predict(file: str, concurrency: int, input_tokens: int, output_tokens: int) -> Predicted | str:
    """The planner's prediction for the instance launched from `file` at this load, or why there is none."""
    from k3deploy.catalog.loader import load_catalog
    from k3deploy.planning.perf_model import PerfUnknown
    from k3deploy.planning.prediction import predict_topology
    from k3deploy.planning.workload import MAX_CONCURRENCY, Workload
    from k3deploy.topology.loader import TopologyError, load_topology
    from k3deploy.topology.units import unit_instances

    try:
        t = unit_instances(load_topology(file).topology)[0].topology
    except (TopologyError, OSError) as exc:
        return f"{file}: {str(exc).splitlines()[0]}"
    w = Workload(input_tokens=input_tokens, output_tokens=max(2, output_tokens), concurrency=concurrency,
                 effort=t.serving.reasoning_effort)
    try:
        p = predict_topology(t, load_catalog(), w)
    except PerfUnknown as exc:
        return str(exc)
    # At the most concurrency a workload may ask for, the running requests are those the caches hold.
    full = predict_topology(t, load_catalog(), w._replace(concurrency=MAX_CONCURRENCY))
    return Predicted(concurrency=concurrency, input_tokens=input_tokens, output_tokens=output_tokens,
                     generated_tok_s=p.output_throughput, ttft_ms=p.ttft_s * 1000, tpot_ms=p.tpot_s * 1000,
                     capacity_running=full.running, capacity_tok_s=full.output_throughput,
                     band=p.band.label() if p.band is not None else "")
