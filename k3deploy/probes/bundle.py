"""One probe as one program for `python3 -c`: the probe's source, preceded by the probe modules it names in
SHIPS_WITH, so a probe split by responsibility still ships by source to a node with nothing of ours on it."""
from __future__ import annotations

import functools
import types
from pathlib import Path

PACKAGE = "k3deploy.probes"
# Registers each shipped module under its package name before the probe runs, so that the probe's own
# `from k3deploy.probes.X import ...` lines resolve from sys.modules on the node (forked workers inherit them).
PREAMBLE = '''import sys as _sys, types as _types
def _k3_define(name, source):
    for parent in ("k3deploy", "k3deploy.probes"):
        if parent not in _sys.modules:
            _sys.modules[parent] = _types.ModuleType(parent)
            _sys.modules[parent].__path__ = []
    module = _types.ModuleType(name)
    module.__file__ = name.replace(".", "/") + ".py"
    _sys.modules[name] = module
    setattr(_sys.modules["k3deploy.probes"], name.rpartition(".")[2], module)
    exec(compile(source, module.__file__, "exec"), module.__dict__)
'''


@functools.cache
def _text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def program(module: types.ModuleType) -> str:
    """The probe's source alone when it ships with nothing, else one program that defines each SHIPS_WITH
    module (in order) and then runs the probe as `__main__`."""
    if module.__file__ is None:
        raise ValueError(f"{module!r} has no source file")
    source = _text(module.__file__)
    shipped = getattr(module, "SHIPS_WITH", ())
    if not shipped:
        return source
    here = Path(module.__file__).parent
    parts = [PREAMBLE]
    for name in shipped:
        parts.append(f"_k3_define({PACKAGE + '.' + name!r}, {_text(str(here / f'{name}.py'))!r})\n")
    main = Path(module.__file__).name
    parts.append(f"exec(compile({source!r}, {PACKAGE.replace('.', '/') + '/' + main!r}, 'exec'), "
                 "{'__name__': '__main__', '__builtins__': __builtins__})\n")
    return "".join(parts)
