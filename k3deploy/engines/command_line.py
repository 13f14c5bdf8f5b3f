"""One node's engine command line: the engine's flags, the user's engine.args over them, argv out."""
from __future__ import annotations

from k3deploy.engines.argv_opts import Opt, flatten, merge
from k3deploy.engines.context import Inputs, Place
from k3deploy.engines.sglang import sglang_opts
from k3deploy.engines.vllm import vllm_opts


def base_opts(inp: Inputs, place: Place) -> tuple[Opt, ...]:
    """The flags k3deploy renders for this engine flavour and node."""
    return sglang_opts(inp, place) if inp.flavour == "sglang" else vllm_opts(inp, place)


def node_opts(inp: Inputs, place: Place) -> tuple[Opt, ...]:
    """The flags the node's engine actually gets: engine.args replace same-dest flags or append."""
    return merge(base_opts(inp, place), inp.topology.engine.args, inp.table)


def engine_argv(inp: Inputs, place: Place) -> tuple[str, ...]:
    """The launcher, the model path as the launcher's form takes it, then every flag."""
    launcher = inp.launcher
    model = launcher.form.model_argv(inp.topology.model.path)
    return (*launcher.prefix, *model, *flatten(node_opts(inp, place)))
