"""The fastest JSON parser the node's interpreter has, stdlib only when it has none other: the probes run
under the engine's own interpreter, which carries one (SGLang and vLLM both depend on msgspec)."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Fastest first (bench/checksum.py). Not orjson, though SGLang carries it and it parses a little faster: it reads
# an integer past 64 bits as a float without a word (a hostile data_offsets would get another verdict).
PARSERS = ("msgspec", "json")

Loads = Callable[[bytes], Any]


def _msgspec() -> Loads:
    import msgspec.json

    fast, error = msgspec.json.decode, msgspec.DecodeError

    def loads(raw: bytes) -> Any:
        try:
            return fast(raw)
        except error:  # the standard library's verdict and words, a ValueError when the text is not JSON
            return json.loads(raw)

    return loads


def parser(name: str | None = None) -> tuple[str, Loads]:
    """(name, loads) of the one named, else of the fastest present; ValueError when the named one is absent.
    What a fast parser refuses is parsed again by the standard library, so every parser gives one result."""
    makers = {"msgspec": _msgspec, "json": lambda: json.loads}
    if name is not None and name not in makers:
        raise ValueError(f"unknown JSON parser {name!r} (one of {', '.join(PARSERS)})")
    for candidate in (name,) if name is not None else PARSERS:
        try:
            return candidate, makers[candidate]()
        except ImportError:
            if name is not None:
                raise ValueError(f"JSON parser {name} is not installed in this interpreter") from None
    raise AssertionError("the standard library's json is always present")
