"""Engine command lines that are known to fail: plan-time errors with the reason, never rendered."""
from __future__ import annotations

import difflib
import ipaddress
import json
import shlex
from collections.abc import Iterator

from k3deploy.catalog.specs import HardwareSpec, ModelSpec
from k3deploy.diagnostics import Issue, fmt_gib
from k3deploy.engines.argv_opts import Opt, arg_problems, effective, merge, user_opt
from k3deploy.engines.command_line import base_opts
from k3deploy.engines.context import Inputs, places
from k3deploy.engines.flag_tables import FlagTable, flag_table
from k3deploy.engines.kernels import (
    SGLANG_DCP_DECODE_BACKENDS,
    SGLANG_HOPPER_UPCAST_MOE,
    VLLM_HOPPER_W4A16_MOE,
    sglang_effective_kernels,
)
from k3deploy.engines.kinds import Family
from k3deploy.engines.launchers import SIM_FORM, model_how, resolve_launcher
from k3deploy.engines.redact import secret_arg, secret_env
from k3deploy.engines.shape import Shape
from k3deploy.engines.vllm import DP_RANK_DESTS, NNODES_DESTS
from k3deploy.topology.schema import Topology

# Set by k3deploy from `parallel` and `nodes`, per node: an engine.args override would desync them.
MANAGED_DESTS = frozenset({
    "tp_size", "ep_size", "pp_size", "dp_size", "attn_dp_size", "dcp_size", "enable_dp_attention",
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "decode_context_parallel_size",
    "enable_expert_parallel", "nnodes", "node_rank", "headless", "data_parallel_start_rank",
    "data_parallel_size_local",
})
RENDEZVOUS_DESTS = ("dist_init_addr", "master_addr", "data_parallel_address")
# Set from model.path, the way the launcher form takes it.
MODEL_DESTS = frozenset({"model_path", "model", "model_tag"})


def _err(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="error", message=message, path=path, hint=hint)


def _warn(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="warning", message=message, path=path, hint=hint)


def _arg_path(flag: str) -> str:
    return f"engine.args.{flag}"


def _user_flag(t: Topology, table: FlagTable, dest: str) -> str | None:
    """The engine.args spelling that sets `dest`, if the user set it."""
    return next((f for f in t.engine.args if (g := table.get(f)) is not None and g.dest == dest), None)


def arg_rules(t: Topology, inp: Inputs) -> Iterator[Issue]:
    """engine.args the pinned engine would reject, that k3deploy owns, or that carry a credential."""
    table = inp.table
    for flag, reason in arg_problems(t.engine.args, table):
        if table.get(flag) is None:
            match = difflib.get_close_matches(flag, list(table.by_flag), n=1, cutoff=0.7)
            yield _err("ENGINE_ARG_UNKNOWN", reason, _arg_path(flag),
                       f"did you mean '{match[0]}'?" if match else "see the engine's --help for this version")
        elif not (table.by_flag[flag].dest == "quantization" and t.engine.args[flag] == "ascend"):
            yield _err("ENGINE_ARG_VALUE", reason, _arg_path(flag))
    for flag, value in t.engine.args.items():
        f = table.get(flag)
        if f is None:
            continue
        if f.dest in MODEL_DESTS:
            yield _err("ENGINE_ARG_MANAGED", f"{flag} is rendered by k3deploy from model.path", _arg_path(flag),
                       "set model.path instead")
        elif f.dest in MANAGED_DESTS and f.dest not in _other_form(t, inp):
            yield _err("ENGINE_ARG_MANAGED", f"{flag} is rendered by k3deploy from parallel/nodes "
                       "(per node where it differs)", _arg_path(flag), "change `parallel` or `nodes` instead")
        o = user_opt(f, flag, value)
        if o is not None and secret_arg(flag, o.values):
            yield _err("ENGINE_ARG_SECRET", f"{flag} carries a credential: command lines are readable by "
                       "every user of the node (/proc/PID/cmdline) and end up in logs", _arg_path(flag),
                       "pass it through engine.secrets (env:NAME or file:/path); vLLM reads VLLM_API_KEY")


def _other_form(t: Topology, inp: Inputs) -> frozenset[str]:
    """The vLLM multi-node flags of the form this deployment does not use (reported as mixing)."""
    if inp.flavour == "sglang" or len(t.nodes) < 2:
        return frozenset()
    return NNODES_DESTS if inp.shape.dp > 1 else DP_RANK_DESTS


def _dests(opts: tuple[Opt, ...], table: FlagTable) -> set[str]:
    return {g.dest for o in opts if (g := table.get(o.flag)) is not None}


def form_rules(t: Topology, inp: Inputs, merged: list[tuple[Opt, ...]]) -> Iterator[Issue]:
    """vLLM: one TP/PP group over --nnodes, or per-node DP ranks; a command with both fails."""
    if inp.flavour == "sglang" or len(t.nodes) < 2:
        return
    for opts in merged:
        dests = _dests(opts, inp.table)
        if dests & NNODES_DESTS and dests & DP_RANK_DESTS:
            form = "per-node DP ranks (dp > 1)" if inp.shape.dp > 1 else "--nnodes/--node-rank (dp = 1)"
            flag = next((f for d in sorted(_other_form(t, inp)) if (f := _user_flag(t, inp.table, d))), None)
            yield _err("VLLM_MIXED_MULTINODE", f"this deployment uses vLLM's {form} form; mixing --nnodes "
                       "with per-node DP flags fails on headless nodes ('must be divisible')",
                       _arg_path(flag) if flag else "engine.args",
                       "remove the other form's flags from engine.args")
            return


def _addr_problem(value: str, dest: str, local: bool) -> str | None:
    host = value
    if not value.strip():
        return "the address is empty"
    if dest == "dist_init_addr":
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            return f"'{value}' is not IP:PORT"
        host = host.strip("[]")
    if not host:
        return "the address is empty"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"'{host}' is not an IP address (rendezvous never goes through DNS)"
    if ip.is_unspecified:
        return f"{host} is not an address other nodes can dial"
    if ip.is_loopback and not local:
        return f"{host} is loopback: every other node would dial itself"
    return None


def rendezvous_rules(t: Topology, inp: Inputs) -> Iterator[Issue]:
    """A rendezvous address overridden in engine.args must be an IP other nodes can dial."""
    # nodes[].ip themselves are checked by rules.node_rules (IP_LOOPBACK, IP_UNSPECIFIED).
    for dest in RENDEZVOUS_DESTS:
        flag = _user_flag(t, inp.table, dest)
        if flag is None or t.engine.args[flag] in (None, False):
            continue
        problem = _addr_problem(str(t.engine.args[flag]), dest, t.launch.nodes_are_here)
        if problem:
            yield _err("RENDEZVOUS_ADDR", f"rendezvous address: {problem}", _arg_path(flag),
                       "drop the override: k3deploy renders rank 0's nodes[].ip")


def kernel_rules(t: Topology, inp: Inputs, opts: tuple[Opt, ...], bf16_weights_bytes: int) -> Iterator[Issue]:
    """SGLang kernels that cannot serve K3 on this accelerator or shape (`bf16_weights_bytes`: the weights per
    GPU with the routed experts held in BF16, the planner's figure)."""
    if inp.flavour == "vllm" and inp.hardware.is_hopper and inp.model.weights.expert_format == "mxfp4":
        o = effective(opts, inp.table, "moe_backend")
        moe = o.values[0] if o is not None and o.values else "auto"
        if moe not in VLLM_HOPPER_W4A16_MOE:
            flag = _user_flag(t, inp.table, "moe_backend")
            yield _err("VLLM_HOPPER_MOE", f"--moe-backend {moe} on {inp.hardware.name} (SM90): the MXFP4 experts "
                       "run without FP4 tensor cores only through the Marlin W4A16 kernel; a backend that falls back "
                       f"to dequantizing them holds {fmt_gib(bf16_weights_bytes)} of weights per GPU against "
                       f"{fmt_gib(inp.hardware.usable_bytes)} usable, out of memory at load",
                       _arg_path(flag) if flag else "engine.args", "use marlin, k3deploy's default")
    if inp.flavour != "sglang":
        return
    k = sglang_effective_kernels(opts, inp.table)
    hw, shape = inp.hardware, inp.shape
    if hw.is_hopper and k.moe in SGLANG_HOPPER_UPCAST_MOE:
        flag = _user_flag(t, inp.table, "moe_runner_backend")
        yield _err("SGLANG_HOPPER_MOE_AUTO", f"--moe-runner-backend {k.moe} on {hw.name} (SM90) "
                   f"{'silently upcasts' if k.moe == 'auto' else 'dequantizes'} the MXFP4 experts to BF16: {fmt_gib(bf16_weights_bytes)} of weights per GPU against "
                   f"{fmt_gib(hw.usable_bytes)} usable, out of memory at load",
                   _arg_path(flag) if flag else "engine.args",
                   "use marlin (the W4A16 kernel), k3deploy's default")
    if shape.dcp > 1 and k.decode_attention not in SGLANG_DCP_DECODE_BACKENDS:
        flag = (_user_flag(t, inp.table, "decode_attention_backend")
                or _user_flag(t, inp.table, "attention_backend"))
        yield _err("SGLANG_DCP_BACKEND", f"dcp={shape.dcp}: SGLang runs K3 with --dcp-size > 1 only on "
                   "decode backend cutedsl_mla (Blackwell) or aiter (AMD), not "
                   f"{k.decode_attention or 'its default'} on {hw.name}",
                   _arg_path(flag) if flag else "parallel.dcp",
                   "set parallel.dcp: 1" if not (hw.is_blackwell or hw.vendor == "amd") else
                   "drop the decode backend override")
    if shape.dcp > 1 and "enable_symm_mem" in _dests(opts, inp.table):
        yield _warn("SGLANG_DCP_SYMM_MEM", "SGLang disables --enable-symm-mem when --dcp-size > 1",
                    _arg_path(_user_flag(t, inp.table, "enable_symm_mem") or "--enable-symm-mem"))


# Config overrides that carry positional-encoding settings (SGLang --json-model-override-args, vLLM --hf-overrides).
OVERRIDE_DESTS = ("json_model_override_args", "hf_overrides")
POSITION_KEYS = ("rope", "yarn", "position")


def _position_keys(value: object) -> list[str]:
    """Keys of a config override (JSON text or a mapping, nested) that set positional encoding."""
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except ValueError:
            return [w for w in POSITION_KEYS if w in text.lower()]
    if not isinstance(value, dict):
        return []
    found = [k for k in value if any(w in str(k).lower() for w in POSITION_KEYS)]
    return found + [k for v in value.values() for k in _position_keys(v)]


def seed_arg_rules(t: Topology, inp: Inputs, opts: tuple[Opt, ...]) -> Iterator[Issue]:
    """engine.args the seeds name as failure modes: a RoPE/YaRN override on a NoPE model, a context past the
    model's, CUDA-IPC feature transport across nodes, the K3 chat parsers dropped."""
    arch = inp.model.architecture
    for dest in OVERRIDE_DESTS:
        flag = _user_flag(t, inp.table, dest)
        keys = _position_keys(t.engine.args[flag]) if flag else []
        if flag and keys and arch.full_attn_position == "nope":
            yield _err("ROPE_OVERRIDE_NOPE", f"{flag} sets {', '.join(keys)}, but {inp.model.id}'s MLA layers use "
                       "NoPE: there is no RoPE base to retune, so a rope-scaling override is at best a no-op and at "
                       "worst a config the engine rejects or misapplies; the 1M context needs no positional change",
                       _arg_path(flag), "drop the positional keys from the override")
    for dest in ("context_length", "max_model_len"):
        o = effective(opts, inp.table, dest)
        flag = _user_flag(t, inp.table, dest)
        if flag and o is not None and o.values and str(o.values[0]).isdigit() \
                and int(o.values[0]) > arch.max_position_embeddings:
            yield _err("CONTEXT_OVER_MODEL", f"{flag} {int(o.values[0]):,} is past {inp.model.id}'s maximum of "
                       f"{arch.max_position_embeddings:,} tokens", _arg_path(flag),
                       "drop the override and set serving.context_length")
    transport = effective(opts, inp.table, "mm_feature_transport")
    if transport is not None and transport.values == ("cuda_ipc",) and len(t.nodes) > 1:
        flag = _user_flag(t, inp.table, "mm_feature_transport") or "--mm-feature-transport"
        yield _err("MM_CUDA_IPC_MULTINODE", f"--mm-feature-transport cuda_ipc across {len(t.nodes)} nodes: CUDA IPC "
                   "hands image features between processes of one node only (the K3 guide, section 37.2)",
                   _arg_path(flag), "use --mm-feature-transport cpu on a multi-node deployment")
    parsers = inp.model.parsers
    for dest, want, section in (("tool_call_parser", parsers.tool_call_parser, "50.6 tool calls appear as text"),
                                ("reasoning_parser", parsers.reasoning_parser,
                                 "50.7 reasoning appears inside the final content")):
        o = effective(opts, inp.table, dest)
        got = o.values[0] if o is not None and o.values else None
        if want and got != want:
            flag = _user_flag(t, inp.table, dest) or f"--{dest.replace('_', '-')}"
            yield _warn("PARSER_NOT_K3", f"{flag} is {got or 'unset'}, not {want}: {want}'s chat format is mis-split "
                        f"(the K3 guide, section {section})", _arg_path(flag),
                        f"drop the override: k3deploy renders --{dest.replace('_', '-')} {want}")
    if inp.family == "vllm" and parsers.tool_call_parser and "enable_auto_tool_choice" not in _dests(opts, inp.table):
        yield _warn("PARSER_NOT_K3", "--enable-auto-tool-choice is off: vLLM uses the tool parser only with auto tool "
                    "choice, so tool calls arrive as text (the K3 guide, section 50.6)",
                    _arg_path("--enable-auto-tool-choice"), "drop the override")


def quant_rules(t: Topology, inp: Inputs, opts: tuple[Opt, ...]) -> Iterator[Issue]:
    """`--quantization ascend` exists only with the vLLM-Ascend plugin."""
    flag = _user_flag(t, inp.table, "quantization")
    if flag and t.engine.args[flag] == "ascend" and inp.flavour != "vllm-ascend":
        yield _err("QUANT_ASCEND_VANILLA", f"--quantization ascend on {t.engine.kind}: only the vLLM-Ascend "
                   "plugin has it (vanilla vLLM fails at start-up: 'Unknown quantization method: ascend'; "
                   "SGLang has no such choice)", _arg_path(flag),
                   "use engine kind vllm-ascend on Ascend NPUs, or drop the flag")


def container_rules(t: Topology) -> Iterator[Issue]:
    """Image pinning, the model mount, secret-looking env, the launcher."""
    image = t.engine.image
    if image and "@sha256:" not in image:
        yield _warn("IMAGE_NOT_PINNED", f"image {image} is not pinned by digest: nodes may pull different "
                    "builds",
                    "engine.image", "use NAME@sha256:<digest> (docker buildx imagetools inspect NAME)")
    if image and (":" in t.model.path or "," in t.model.path):
        yield _err("DOCKER_MODEL_PATH", f"docker cannot mount {t.model.path!r}: ':' and ',' split -v specs",
                   "model.path")
    for name, value in t.engine.env.items():
        if secret_env(name, value):
            yield _warn("ENV_LOOKS_SECRET", f"engine.env {name} looks like a secret: it is redacted in every "
                        "rendered output and exported scripts read it from the node's environment",
                        f"engine.env.{name}", f"use engine.secrets: {{{name}: 'env:{name}'}} or 'file:/path'")
    if t.engine.launcher is not None and not t.engine.launcher:
        yield _err("LAUNCHER_EMPTY", "engine.launcher is an empty argv prefix", "engine.launcher",
                   "omit it to use the engine's own executable")


def _other_engine_form(words: list[str], inp: Inputs) -> str | None:
    """The launcher form of the other engine family this launcher is, if any."""
    other: Family = "vllm" if inp.family == "sglang" else "sglang"
    found = resolve_launcher(words, other, flag_table(other), other)
    return found.form.name if found.known else None


def launcher_rules(t: Topology, inp: Inputs) -> Iterator[Issue]:
    """A launcher k3deploy does not know, and entry points that cannot run this deployment."""
    if not t.engine.launcher:
        return
    launcher = inp.launcher
    form = launcher.form
    other = None if launcher.known or t.engine.kind == "sim" else _other_engine_form(t.engine.launcher, inp)
    if other is not None:
        yield _err("LAUNCHER_ENGINE_MISMATCH", f"engine.launcher {shlex.join(t.engine.launcher)} starts "
                   f"`{other}`, but engine.kind is {t.engine.kind}", "engine.launcher",
                   "set engine.kind to the engine the launcher starts, or change the launcher")
    elif not launcher.known:
        forms = SIM_FORM.name if t.engine.kind == "sim" else ", ".join(f.name for f in inp.table.forms)
        yield _warn("LAUNCHER_UNKNOWN", f"engine.launcher {shlex.join(t.engine.launcher)} is none of the "
                    f"launcher forms k3deploy knows ({forms}): it is rendered as `{form.name}`, the model "
                    f"{model_how(form)}", "engine.launcher",
                    "make sure it takes that command line, or use one of the known forms")
    if form.headless is False and len(t.nodes) > 1:
        yield _err("LAUNCHER_NO_HEADLESS", f"`{form.name}` ignores --headless: every worker node would start "
                   "its own API server and engine instead of joining rank 0", "engine.launcher",
                   "use `vllm serve` (e.g. launcher [/path/to/vllm, serve]) for a multi-node deployment")


def engine_rules(t: Topology, model: ModelSpec, hw: HardwareSpec, shape: Shape, *,
                 bf16_weights_bytes: int) -> Iterator[Issue]:
    """Every engine-command check, on the options exactly as they would be rendered: the planner asks once and
    gets the problems back."""
    inp = Inputs(topology=t, model=model, hardware=hw, shape=shape)
    version = inp.table.engine.split()[-1]
    if t.engine.version and t.engine.version != version:
        yield _warn("ENGINE_VERSION", f"engine.version {t.engine.version}: k3deploy renders and checks "
                    f"flags for {inp.table.engine}", "engine.version")
    if inp.family == "vllm" and t.serving.max_running_requests is None:
        yield _err("VLLM_MAX_NUM_SEQS", "vLLM sizes its KDA state pages from --max-num-seqs: "
                   "serving.max_running_requests cannot be left to the engine", "serving.max_running_requests",
                   "set a number (vLLM-Ascend's K3 tutorial runs 16 per DP rank)")
    yield from container_rules(t)
    yield from launcher_rules(t, inp)
    arg_issues = list(arg_rules(t, inp))
    yield from arg_issues
    if any(i.code == "ENGINE_ARG_UNKNOWN" for i in arg_issues):
        return
    merged = [merge(base_opts(inp, p), t.engine.args, inp.table) for p in places(t)]
    yield from form_rules(t, inp, merged)
    yield from rendezvous_rules(t, inp)
    yield from kernel_rules(t, inp, merged[0], bf16_weights_bytes)
    yield from seed_arg_rules(t, inp, merged[0])
    yield from quant_rules(t, inp, merged[0])
