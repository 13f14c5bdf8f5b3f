"""Secret-looking names and values, and their redaction in everything k3deploy shows or writes."""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
_SECRET_WORDS = frozenset({"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "KEY", "APIKEY", "CREDENTIAL",
                           "CREDENTIALS"})
_TOKEN_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"
    r"|xox[abprs]-[\w-]{10,}|AKIA[0-9A-Z]{16}|glpat-[\w-]{20,}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"
)
_LONG_HEX = re.compile(r"[0-9a-fA-F]{32,}")
_LONG_B64 = re.compile(r"[A-Za-z0-9+_-][A-Za-z0-9+/_-]{31,}={0,2}")
_ENV_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[_\-.]+", name.upper()) if p]


def _plain_number(value: str) -> bool:
    return value.isdigit() and len(value) <= 12


def secret_value(value: str) -> bool:
    """A value that looks like a credential: a known token format, or a long hex/base64 blob."""
    if _TOKEN_VALUE.search(value) or _LONG_HEX.fullmatch(value):
        return True
    blob = _LONG_B64.fullmatch(value)
    # Random base64 mixes digits and both cases; long lowercase-hyphenated names do not.
    return bool(blob) and any(c.isdigit() for c in value) and any(c.isupper() for c in value) \
        and any(c.islower() for c in value)


def secret_env(name: str, value: str) -> bool:
    """An env entry to hide: a secret-sounding name (HF_TOKEN, *_API_KEY, ...) or a secret-looking value."""
    if value and not _plain_number(value) and any(p in _SECRET_WORDS for p in _parts(name)):
        return True
    return secret_value(value)


def secret_flag(flag: str) -> bool:
    """A flag whose value is a credential (--api-key, --hf-token, --ssl-keyfile-password)."""
    parts = _parts(flag)
    return bool(parts) and parts[-1] in _SECRET_WORDS


def secret_arg(flag: str, values: Iterable[str]) -> bool:
    """An engine argument carrying a credential (by flag name, or by what the value looks like)."""
    values = [v for v in values if not _plain_number(v)]
    return bool(values) and (secret_flag(flag) or any(secret_value(v) for v in values))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The env with secret-looking values replaced by <redacted>."""
    return {k: (REDACTED if secret_env(k, v) else v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> tuple[str, ...]:
    """argv with credentials replaced: values of secret flags, `-e NAME=value` pairs, token-like words."""
    out: list[str] = []
    prev = ""
    for tok in argv:
        new = tok
        flag, eq, val = tok.partition("=")
        assign = _ENV_ASSIGN.fullmatch(tok)
        if prev.startswith("-") and secret_flag(prev) and not tok.startswith("-") and not _plain_number(tok):
            new = REDACTED
        elif tok.startswith("-") and eq and secret_arg(flag, [val]):
            new = f"{flag}={REDACTED}"
        elif assign and secret_env(assign.group(1), assign.group(2)):
            new = f"{assign.group(1)}={REDACTED}"
        elif secret_value(tok):
            new = REDACTED
        out.append(new)
        prev = tok
    return tuple(out)
