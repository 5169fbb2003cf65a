"""The one place credentials are taken out of anything opbench records or prints.

Every writer that records a command line, options or an error (CSV cells, JSON sidecars, ``report.md``, logs,
printed replay/rerun commands) passes it through :func:`redact` (any JSON-like value) or :func:`redact_text` (a
string). What counts as a credential is written in docs/conventions.md ("Secrets"): a mapping key or ``name=``
whose name holds one of :data:`SECRET_WORDS`, the password of a URL, an ``Authorization`` header, and the value of
any environment variable named ``AWS_*``, ``GOOGLE_*``, ``AZURE_*`` or holding a secret word. Values become
``***``; the names stay, so a reader still sees which option was given. Torch-free.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
# A name is a credential's when one of its parts (split at '_', '-', '.', camelCase) is one of these words.
SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "accesskey",
        "secret",
        "token",
        "password",
        "passwd",
        "session",
        "authorization",
        "credential",
        "credentials",
        "auth",
        "cookie",
        "sig",
        "signature",
    }
)
SECRET_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")
# Names that hold a secret word but are model or benchmark fields, not credentials (num_key_value_heads).
_NOT_SECRET_PARTS = (("key", "value"), ("kv",))
# Environment values shorter than this are not searched for in text (a 1-character value would mask every digit).
_MIN_ENV_VALUE = 6

_PARTS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_NAME = r"[A-Za-z_][\w.\-]*"
# "name": "value" / 'name': 'value' (JSON, Python reprs): the quoted value.
_QUOTED_PAIR = re.compile(rf"""(["']({_NAME})["']\s*[:=]\s*)(["'])((?:\\.|(?!\3).)*)\3""")
# "name": 123 / 'name': None: an unquoted JSON value (number, literal) up to the next delimiter.
_BARE_JSON_PAIR = re.compile(
    rf"""(["']({_NAME})["']\s*:\s*)(?!["'\s]|(?:None|null|True|true|False|false)\b)([^,}}\]\s]+)"""
)
# name=value (env assignments, URL queries, --flag=value): up to whitespace, '&', ',', ';', a quote or bracket.
_ASSIGN = re.compile(rf"""(?<![\w.\-])(-{{0,2}}({_NAME})=)([^\s&,;'"}}\])]+)""")
# --secret-key VALUE / --token VALUE: a flag whose name is a credential's, then its value as a separate word.
_FLAG_VALUE = re.compile(rf"""(?<!\S)(--?({_NAME})\s+)(?!-)(\S+)""")
# scheme://user:password@host
_URL_PASSWORD = re.compile(r"(?i)([a-z][a-z0-9+.\-]*://[^/\s:@]*:)([^@/\s]+)(@)")
# HTTP headers quoted in errors: Authorization: Bearer abc, X-Amz-Security-Token: abc, Cookie: abc
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-amz-security-token|x-amz-credential|x-goog-api-key|x-api-key|cookie)"
    r"(:\s*)(?:(Bearer|Basic|AWS4-HMAC-SHA256)\s+)?([^\s,'\"]+)"
)


@functools.lru_cache(maxsize=4096)  # names repeat (every environment variable, every call): parse each once
def is_secret_name(name: str) -> bool:
    """Whether an option, mapping key or environment variable with this name holds a credential."""
    if name.upper().startswith(SECRET_ENV_PREFIXES):
        return True
    parts = [p.lower() for p in _PARTS.findall(name)]
    for skip in _NOT_SECRET_PARTS:
        if any(tuple(parts[i : i + len(skip)]) == skip for i in range(len(parts))):
            return False
    return any(p in SECRET_WORDS for p in parts)


def _secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if v and len(v) >= _MIN_ENV_VALUE and is_secret_name(k)}
    return sorted(values, key=len, reverse=True)  # longest first, so a value inside another is not cut in two


def _masked(match: re.Match[str], name_group: int, keep: str) -> str:
    return keep if is_secret_name(match.group(name_group)) else match.group(0)


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential-like value replaced by ``***`` (see the module docstring)."""
    if not text:
        return text
    if text.isalnum():  # a number, a plain word: nothing to mask unless it is an environment secret itself
        return MASK if text in _secret_env_values(environ) else text
    out = _QUOTED_PAIR.sub(lambda m: _masked(m, 2, f"{m.group(1)}{m.group(3)}{MASK}{m.group(3)}"), text)
    out = _BARE_JSON_PAIR.sub(lambda m: _masked(m, 2, f"{m.group(1)}{MASK}"), out)
    out = _ASSIGN.sub(lambda m: _masked(m, 2, f"{m.group(1)}{MASK}"), out)
    out = _FLAG_VALUE.sub(lambda m: _masked(m, 2, f"{m.group(1)}{MASK}"), out)
    out = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}{m.group(3)}", out)
    out = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) + ' ' if m.group(3) else ''}{MASK}", out)
    for value in _secret_env_values(environ):
        out = out.replace(value, MASK)
    return out


def redact(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of ``value`` (mapping, list, tuple, string, scalar) with credentials masked: a mapping entry whose key
    is a secret name is masked whole, strings are passed through :func:`redact_text`, other scalars kept."""
    if isinstance(value, Mapping):
        return {
            k: (MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "") else redact(v, environ))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, environ) for v in value)
    if isinstance(value, str):
        return redact_text(value, environ)
    return value
