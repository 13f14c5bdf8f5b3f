"""A serving workload as `--workload in=8192,out=1024,concurrency=16[,effort=high][,prompts=80]` gives it."""
from __future__ import annotations

from typing import Any, NamedTuple

from k3deploy.errors import InputError

EFFORTS = ("low", "high", "max")
# Far past any served context: a bigger number is a typo, and would only make the arithmetic meaningless.
MAX_TOKENS = 1 << 24
MAX_CONCURRENCY = 1 << 20
EXAMPLE = "in=8192,out=1024,concurrency=16,effort=high"


class Workload(NamedTuple):
    """Fixed prompt and answer lengths at a fixed concurrency, as `vllm bench serve --dataset-name random
    --random-range-ratio 1 --max-concurrency C` runs it. `output_tokens` counts every completion token,
    reasoning included, so the effort changes how long answers are, not what a token costs."""

    input_tokens: int
    output_tokens: int
    concurrency: int
    effort: str = "max"
    num_prompts: int | None = None

    @property
    def prompts(self) -> int:
        """Requests in the run (default 5 x concurrency, the cookbooks' convention)."""
        return self.num_prompts or 5 * self.concurrency

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value."""
        return self._asdict()


_KEYS = {"in": "input_tokens", "out": "output_tokens", "concurrency": "concurrency", "effort": "effort",
         "prompts": "num_prompts"}


def parse_workload(text: str) -> Workload:
    """`in=8192,out=1024,concurrency=16[,effort=high][,prompts=N]` -> Workload; InputError names the part."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise InputError(f"--workload {text!r}: '{part}' is not one of {', '.join(k + '=' for k in _KEYS)}",
                             hint=f"e.g. --workload {EXAMPLE}")
        if _KEYS[key] in values:
            raise InputError(f"--workload {text!r}: '{key}' given twice", hint=f"e.g. --workload {EXAMPLE}")
        values[_KEYS[key]] = _value(text, key, raw.strip())
    missing = [k for k in ("in", "out", "concurrency") if _KEYS[k] not in values]
    if missing:
        raise InputError(f"--workload {text!r}: missing {', '.join(k + '=' for k in missing)}",
                         hint=f"e.g. --workload {EXAMPLE}")
    return Workload(**values)


def _value(text: str, key: str, raw: str) -> Any:
    if key == "effort":
        if raw not in EFFORTS:
            raise InputError(f"--workload {text!r}: effort={raw!r}: expected one of {', '.join(EFFORTS)}")
        return raw
    limit = MAX_CONCURRENCY if key in ("concurrency", "prompts") else MAX_TOKENS
    low = 2 if key == "out" else 1  # TPOT needs a second token
    try:
        n = int(raw.replace("_", ""))
    except ValueError:
        n = -1
    if not low <= n <= limit:
        raise InputError(f"--workload {text!r}: {key}={raw!r}: expected a whole number from {low} to {limit:,}")
    return n
