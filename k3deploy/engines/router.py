"""The router's command: its settings (sized by the plan) in, an argv checked against the router's pinned flag
table (engines/data/routers/, from its real parser by scripts/router_flag_tables.py) out. Pure."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from k3deploy.engines.context import host_port
from k3deploy.engines.flag_tables import Flag

ROUTER_DATA = Path(__file__).parent / "data" / "routers"
# kind -> flag table file; each router starts as `python -m MODULE` (sglang-router 0.3.2 installs a console
# script named `smg` that shadows smg 1.13.0's, so no router is started by script name).
ROUTER_TABLES = {"smg": "smg-1.13.0.json", "sglang-router": "sglang-router-0.3.2.json",
                 "vllm-router": "vllm-router-0.1.17.json"}


@dataclass(frozen=True)
class RouterTable:
    """One pinned router version's parser."""

    router: str
    module: str
    by_flag: dict[str, Flag]

    def choices(self, flag: str) -> tuple[str, ...] | None:
        """The values the router accepts for `flag` (None: any)."""
        f = self.by_flag.get(flag)
        return f.choices if f is not None else None


@functools.lru_cache(maxsize=4)
def router_table(kind: str) -> RouterTable:
    """Load one packaged router flag table."""
    raw = json.loads((ROUTER_DATA / ROUTER_TABLES[kind]).read_text(encoding="utf-8"))
    by_flag: dict[str, Flag] = {}
    for a in raw["arguments"]:
        choices = a.get("choices")
        f = Flag(flags=tuple(a["flags"]), dest=a["dest"], takes_value=bool(a["takes_value"]), type=a.get("type"),
                 nargs=a.get("nargs"), choices=tuple(choices) if choices is not None else None)
        for spelling in f.flags:
            by_flag[spelling] = f
    return RouterTable(router=raw["router"], module=raw["module"], by_flag=by_flag)


@dataclass(frozen=True)
class RouterSettings:
    """What the router's command is made of (the plan sizes the timeouts)."""

    kind: str
    listen: str
    port: int
    worker_urls: tuple[str, ...]
    policy: str
    health_failure_threshold: int
    health_success_threshold: int
    health_check_interval_s: int
    health_check_timeout_s: int
    startup_timeout_s: int
    # PD mode (roles): each prefill's URL with its bootstrap port (None: vLLM NIXL has none), each decode's URL.
    prefill: tuple[tuple[str, int | None], ...] = ()
    decode: tuple[str, ...] = ()
    metrics_port: int | None = None  # None: port + 1

    @property
    def prometheus_port(self) -> int:
        """Where the router's Prometheus exporter listens (on `listen`)."""
        return self.metrics_port or self.port + 1

    @property
    def url(self) -> str:
        """Where clients reach the router."""
        return f"http://{host_port(self.listen, self.port)}"


def argv_problems(kind: str, argv: tuple[str, ...]) -> list[str]:
    """Why the router's parser would refuse `argv` (the part after `python -m MODULE`), per its table."""
    table = router_table(kind)
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = table.by_flag.get(argv[i])
        if flag is None:
            out.append(f"{table.router} has no flag {argv[i]}")
            i += 1
            continue
        values: list[str] = []
        i += 1
        while flag.takes_value and i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        if flag.takes_value and not values and flag.nargs not in ("*", "?"):
            out.append(f"{argv[i - 1]} takes a value")
        if flag.nargs is None and len(values) > 1:
            out.append(f"{flag.flags[0]} takes one value, got {len(values)}")
        for v in values:
            if flag.choices is not None and v not in flag.choices:
                out.append(f"{flag.flags[0]}: '{v}' is not one of {', '.join(flag.choices)}")
            elif flag.type == "int" and not v.lstrip("-").isdigit():
                out.append(f"{flag.flags[0]} takes an integer, not '{v}'")
    return out


# The flag that turns PD mode on, per router (vllm-router keeps --pd-disaggregation for SGLang workers).
PD_FLAG = {"smg": "--pd-disaggregation", "sglang-router": "--pd-disaggregation",
           "vllm-router": "--vllm-pd-disaggregation"}


def pd_args(s: RouterSettings) -> tuple[str, ...]:
    """The PD part of the command: `--prefill URL [BOOTSTRAP_PORT]` per prefill, `--decode URL` per decode,
    one policy for each side (the form of each router's own --help)."""
    out: list[str] = [PD_FLAG[s.kind]]
    if s.kind == "vllm-router":
        out += ["--kv-connector", "nixl"]
    for url, port in s.prefill:
        out += ["--prefill", url, *((str(port),) if port is not None else ())]
    for url in s.decode:
        out += ["--decode", url]
    return (*out, "--prefill-policy", s.policy, "--decode-policy", s.policy)


def router_argv(s: RouterSettings, python: str = "python3") -> tuple[str, ...]:
    """The router's full command; raises ValueError when its own table refuses a flag (a k3deploy bug)."""
    workers = pd_args(s) if s.prefill else ("--worker-urls", *s.worker_urls, "--policy", s.policy)
    args = ("--host", s.listen, "--port", str(s.port), *workers,
            "--health-failure-threshold", str(s.health_failure_threshold),
            "--health-success-threshold", str(s.health_success_threshold),
            "--health-check-interval-secs", str(s.health_check_interval_s),
            "--health-check-timeout-secs", str(s.health_check_timeout_s),
            "--worker-startup-timeout-secs", str(s.startup_timeout_s),
            # Every router's exporter binds 0.0.0.0:29000 unless told: a second router (or anything else on
            # 29000) on the machine makes it exit at start ("failed to bind metrics server").
            "--prometheus-host", s.listen, "--prometheus-port", str(s.prometheus_port))
    problems = argv_problems(s.kind, args)
    if problems:
        raise ValueError(f"router command refused by {router_table(s.kind).router}'s flag table: "
                         + "; ".join(problems))
    return (python, "-m", router_table(s.kind).module, *args)
