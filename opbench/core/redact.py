"""The one place credentials are taken out of anything opbench records or prints.

Every writer that records a command line, options or an error (CSV cells, JSON sidecars, ``report.md``, logs,
printed replay/rerun commands) passes it through :func:`redact` (any JSON-like value) or :func:`redact_text` (a
string). What counts as a credential is written in docs/conventions.md ("Secrets"): the value of a mapping key,
``name=``, ``NAME:`` or ``--name`` whose name holds one of :data:`SECRET_WORDS` (a quoted value whole, a JSON
object inside a text read as JSON), the password of a URL, an ``Authorization`` header, and the value of any
environment variable named ``AWS_*``, ``GOOGLE_*``, ``AZURE_*`` or holding a secret word. Values become ``***``;
the names stay, so a reader still sees which option was given. Torch-free; a few µs a CSV cell.
"""

from __future__ import annotations

import functools
import json
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
# Names that hold a secret word but are model or benchmark fields, not credentials (num_key_value_heads,
# token_count).
_NOT_SECRET_PARTS = (("key", "value"), ("kv",), ("token", "count"))
# Environment values shorter than this are not searched for in text (a 1-character value would mask every digit).
_MIN_ENV_VALUE = 6

_PARTS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_NAME = r"[A-Za-z_][\w.\-]*"
# A quoted name may spell letters as JSON escapes ("secr\u0065t"): they are decoded before the name is judged.
_QNAME = r"(?:[A-Za-z_]|\\u[0-9a-fA-F]{4})(?:[\w.\-]|\\u[0-9a-fA-F]{4})*"
_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")
# A value: one quoted string ('a b c', "a b", shlex's 'it'"'"'s'), or a run of characters up to a delimiter.
_QUOTED = r"""(?:'[^']*'|"(?:\\.|[^"\\])*")+"""
_VALUE = rf"""{_QUOTED}|[^\s&,;'"}}\])]+"""
# An HTTP authorization scheme: "Bearer X" is one value, the scheme is kept and X masked.
_SCHEME = r"(?i:Bearer|Basic|Digest|Negotiate|Token|AWS4-HMAC-SHA256)"
# "name": "value" / 'name': 'value' (JSON, Python reprs): the quoted value.
_QUOTED_PAIR = re.compile(rf"""(["']({_QNAME})["']\s*[:=]\s*)(["'])((?:\\.|(?!\3).)*)\3""")
# "name": 123 / 'name': None: an unquoted JSON value (number, literal) up to the next delimiter.
_BARE_JSON_PAIR = re.compile(
    rf"""(["']({_QNAME})["']\s*:\s*)(?!["'\s]|(?:None|null|True|true|False|false)\b)([^,}}\]\s]+)"""
)
# One quoted word that starts with a credential's flag or assignment: '--password a b c', '--api-key=x y',
# "token=abc def" (shlex.join quotes a whole argument so): everything up to the closing quote is the value.
_WORD_HEAD = rf"""((?:--?({_NAME})[ \t]+(?!-)|-{{0,2}}({_NAME})[ \t]*=[ \t]*)({_SCHEME}[ \t]+)?)"""
_QUOTED_WORDS = (
    ("'", re.compile(rf"""'{_WORD_HEAD}((?:[^']|'"'"')+)'""")),
    ('"', re.compile(rf'''"{_WORD_HEAD}((?:\\.|[^"\\])+)"''')),
)
# The three forms below are found by their head (the name and what follows it) alone; a value is read after a head
# whose name is a credential's, so a name inside another's value is still found (--storage-options=key=A,secret=B).
# name=value, name = value (env assignments, URL queries, --flag=value).
_ASSIGN = re.compile(rf"""(?<![\w.\-])-{{0,2}}(?P<name>{_NAME})[ \t]*=(?!=)[ \t]*""")
# NAME: value (YAML, env listings, GITHUB_TOKEN: ghp_x); not after a CamelCase name (KeyError: 'x', ExpiredToken:
# The token ...: exception and error-code names), not None/null.
_COLON = re.compile(rf"""(?<![\w.\-'"/:])(?P<name>{_NAME}):[ \t]+(?!(?:None|null)\b)""")
_CAMEL = re.compile(r"[A-Z][a-z0-9]+[A-Z]")
# --secret-key VALUE / --token VALUE: a flag whose name is a credential's, then its value as a separate word; also
# inside a quoted word ('--hf-token hf_x') or after '=' (--replay-arg=--hf-token x).
_FLAG = re.compile(r"""(?<![^\s'"=])--?(?P<name>[A-Za-z_][\w.\-]*)[ \t]+(?!-)""")
# A Python list of arguments as printed ("['--password', 'x']", a CalledProcessError's command): a quoted flag
# word, a comma, then its value as the next quoted word.
_LISTED_FLAG = re.compile(rf"""(["'])--?({_NAME})\1(,[ \t]*)(["'])((?:\\.|(?!\4).)*)\4""")
_LONE_FLAG = re.compile(rf"--?{_NAME}")  # one argument that is a flag alone (its value is the next one)
# Their values: a quoted string whole, else up to whitespace, '&', ',', ';', a quote or bracket (a flag's: up to
# whitespace or a quote). "Bearer X" is one value: the scheme is kept, X masked.
_VALUE_AFTER = re.compile(rf"""({_SCHEME}[ \t]+(?![-\s]))?(?:{_VALUE})""")
_WORD_AFTER = re.compile(rf"""({_SCHEME}[ \t]+(?![-\s]))?(?:{_QUOTED}|[^\s'"]+)""")
# scheme://user:password@host
_URL_PASSWORD = re.compile(r"(?i)([a-z][a-z0-9+.\-]*://[^/\s:@]*:)([^@/\s]+)(@)")
# HTTP headers quoted in errors: Authorization: Bearer abc, X-Amz-Security-Token: abc, Cookie: abc
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-amz-security-token|x-amz-credential|x-goog-api-key|x-api-key|cookie)"
    rf"(:\s*)(?:({_SCHEME})\s+)?([^\s,'\"]+)"
)
# Where a JSON object may start inside a text ('{"key": ...}' in a command line): parsed, masked, written back.
_JSON_OBJECT = re.compile(r'\{\s*"')
_JSON = json.JSONDecoder()
_JSON_TRIES = 32


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


def _env_values(env: Mapping[str, str]) -> list[str]:
    values = {v for k, v in env.items() if v and len(v) >= _MIN_ENV_VALUE and is_secret_name(k)}
    return sorted(values, key=len, reverse=True)  # longest first, so a value inside another is not cut in two


_env_cache: tuple[dict[Any, Any], list[str]] = ({}, [])


def _secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    if environ is not None:
        return _env_values(environ)
    # Reading os.environ decodes every entry (about 20 µs, on every cell): its raw entries are compared with the
    # last call's instead (the same objects while nothing is set), and read again only when they differ.
    global _env_cache
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return _env_values(os.environ)
    if raw != _env_cache[0]:
        _env_cache = (dict(raw), _env_values(os.environ))
    return _env_cache[1]


def _masked(match: re.Match[str], name_group: int, keep: str) -> str:
    return keep if is_secret_name(_name(match.group(name_group))) else match.group(0)


def _name(name: str) -> str:
    return _UNICODE_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), name) if "\\" in name else name


def _quoted_word(m: re.Match[str]) -> str:
    quote = m.group(0)[0]
    return f"{quote}{m.group(1)}{MASK}{quote}" if is_secret_name(m.group(2) or m.group(3)) else m.group(0)


def _sub(head: re.Pattern[str], value: re.Pattern[str], text: str, camel_ok: bool = True) -> str:
    """Every value read by ``value`` after a ``head`` whose name is a credential's, as ``***`` (an authorization
    scheme before it kept). A head that is no credential's uses up only itself (linear on any text)."""
    pieces: list[str] = []
    pos = 0
    while (m := head.search(text, pos)) is not None:
        name = m.group("name")
        found = None
        if is_secret_name(name) and (camel_ok or not _CAMEL.match(name)):
            found = value.match(text, m.end())
        if found is None:
            pieces.append(text[pos : m.end()])
            pos = m.end()
        else:
            pieces += [text[pos : m.end()], found.group(1) or "", MASK]
            pos = found.end()
    return "".join(pieces) + text[pos:] if pieces else text


def _json_objects(text: str, environ: Mapping[str, str] | None) -> str:
    """JSON objects inside ``text`` (--storage-options '{"secr\\u0065t": "x"}') parsed, so that escapes in their
    names do not hide a credential, and written back masked where they held one."""
    pieces: list[str] = []
    done = 0
    tries = _JSON_TRIES  # each try may read to the end of the text: a bound keeps a text of many '{"' linear
    for m in _JSON_OBJECT.finditer(text):
        if m.start() < done:
            continue  # inside an object already read
        if (tries := tries - 1) < 0:
            break
        try:
            value, end = _JSON.raw_decode(text, m.start())
        except ValueError:
            continue
        except RecursionError:
            break
        masked = redact(value, environ)
        pieces += [
            text[done : m.start()],
            json.dumps(masked, ensure_ascii=False) if masked != value else text[m.start() : end],
        ]
        done = end
    return "".join(pieces) + text[done:] if pieces else text


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential-like value replaced by ``***`` (see the module docstring)."""
    if not text:
        return text
    env_values = _secret_env_values(environ)
    if text.isalnum():  # a number, a plain word: nothing to mask unless it is an environment secret itself
        return MASK if text in env_values else text
    out = text
    if "{" in out:
        out = _json_objects(out, environ)
    if "'" in out or '"' in out:
        for quote, word in _QUOTED_WORDS:
            if quote in out:
                out = word.sub(_quoted_word, out)
        out = _QUOTED_PAIR.sub(lambda m: _masked(m, 2, f"{m.group(1)}{m.group(3)}{MASK}{m.group(3)}"), out)
        out = _BARE_JSON_PAIR.sub(lambda m: _masked(m, 2, f"{m.group(1)}{MASK}"), out)
        out = _LISTED_FLAG.sub(lambda m: _masked(m, 2, m.group(0)[: m.start(5) - m.start()] + MASK + m.group(4)), out)
    if "=" in out:
        out = _sub(_ASSIGN, _VALUE_AFTER, out)
    if ":" in out:
        out = _sub(_COLON, _VALUE_AFTER, out, camel_ok=False)
    if "-" in out:
        out = _sub(_FLAG, _WORD_AFTER, out)
    if "://" in out:
        out = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}{m.group(3)}", out)
    if ":" in out:
        out = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) + ' ' if m.group(3) else ''}{MASK}", out)
    for value in env_values:
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
        # an argument list: the word after a credential's flag ('--password', 'x') is its value
        after_flag = [
            i + 1
            for i, v in enumerate(value[:-1])
            if isinstance(v, str) and _LONE_FLAG.fullmatch(v) and is_secret_name(v.lstrip("-"))
        ]
        masked = [redact(v, environ) for v in value]
        for i in after_flag:
            if isinstance(value[i], str) and value[i] and not value[i].startswith("-"):
                masked[i] = MASK
        return type(value)(masked)
    if isinstance(value, str):
        return redact_text(value, environ)
    return value
