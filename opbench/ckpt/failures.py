"""Why a checkpoint case failed, in one line for its CSV cell, with the whole traceback kept for the errors log;
and which failures belong to the storage itself (endpoint unreachable, bucket missing, access denied), so that the
sweep ends the storage's remaining cases at once instead of paying every case's retries (docs/ckpt.md,
"When the storage fails"). No torch import: the exceptions are recognised by class name, code and errno."""

from __future__ import annotations

import errno
import os
import socket
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from opbench.core.sweep import classify_failure


class Storage(Protocol):
    """What a failure's description reads of a storage (storage.Storage has it; storage.py imports this module,
    not the other way round)."""

    @property
    def local_root(self) -> str | None: ...

    @property
    def bucket(self) -> str: ...

    @property
    def options(self) -> Mapping[str, Any]: ...


# RankFailure.status (core.dist) of a failure every later case on the same storage would repeat.
STORAGE_DOWN = "storage_down"

# S3 error codes (and HeadBucket's bare HTTP statuses) that mean the credentials were refused.
ACCESS_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountProblem",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidSecurity",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
        "Forbidden",
        "403",
        "401",
    }
)
# Failures to open a connection at all (botocore, aiohttp), as opposed to one dropped mid-request.
UNREACHABLE_CLASSES = frozenset(
    {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ProxyConnectionError"}
)
UNREACHABLE_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EADDRNOTAVAIL}
)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then DCP's per-rank exceptions inside a CheckpointException, then each one's cause chain."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [pair[0] for pair in _dcp_failures(e).values()]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _dcp_failures(exc: BaseException) -> dict[int, Any]:
    """rank -> (exception, stack) of DCP's CheckpointException; empty for any other exception."""
    failures = getattr(exc, "failures", None) if type(exc).__name__ == "CheckpointException" else None
    return dict(failures) if isinstance(failures, dict) else {}


def _code(exc: BaseException) -> str:
    """A botocore ClientError's error code ('NoSuchBucket', '403'); empty otherwise."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


def _endpoint(exc: BaseException, storage: Storage) -> str:
    """scheme://host:port the storage was reached at, from the error or the options; '' when unknown."""
    url = (getattr(exc, "kwargs", None) or {}).get("endpoint_url") or _option_endpoint(storage)
    if not url:
        host = getattr(exc, "host", None)  # aiohttp's ClientConnectorError
        return f"{host}:{getattr(exc, 'port', '')}" if host else ""
    parts = urlsplit(str(url))
    if not parts.hostname:
        return ""
    where = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"
    # an AWS_* variable's value is masked wherever it is printed (core.redact): say which variable it was
    named = next((k for k in ENDPOINT_VARIABLES if os.environ.get(k, "").startswith(where)), None)
    return f"{where} (from {named})" if named else where


ENDPOINT_VARIABLES = ("FSSPEC_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def _option_endpoint(storage: Storage) -> str:
    opts = storage.options
    client = opts.get("client_kwargs")
    client = client if isinstance(client, dict) else {}
    return str(
        opts.get("endpoint_url")
        or client.get("endpoint_url")
        or next((os.environ[k] for k in ENDPOINT_VARIABLES if os.environ.get(k)), "")
    )


def storage_down_reason(exc: BaseException, storage: Storage) -> str | None:
    """One line when ``exc`` says the storage cannot be used at all (every case there would fail the same way);
    None for a failure of this case only. Object storage only: a local path's errors are the case's. The words
    avoid those by which core.dist.job_broken recognises a dead peer."""
    if storage.local_root is not None:
        return None
    chain = list(causes(exc))
    codes = [c for c in map(_code, chain) if c]
    texts = [" ".join(str(e).split()) for e in chain]
    if "NoSuchBucket" in codes or any("specified bucket does not exist" in t.lower() for t in texts):
        return f"bucket '{storage.bucket}' does not exist"
    if any(_code(e) == "404" and getattr(e, "operation_name", "") == "HeadBucket" for e in chain):
        return f"bucket '{storage.bucket}' does not exist"
    denied = [e for e in chain if _code(e) in ACCESS_DENIED_CODES or isinstance(e, PermissionError)]
    if denied:
        code = next((c for c in codes if c in ACCESS_DENIED_CODES and not c.isdigit()), "")
        text = next((t for e, t in zip(chain, texts) if e in denied and t and t != code), "")
        detail = ": ".join(part for part in (code, text[:160]) if part) or "forbidden"
        return f"access denied: the storage refused these credentials ({detail})"
    for e in chain:
        if (
            type(e).__name__ in UNREACHABLE_CLASSES
            or isinstance(e, (ConnectionRefusedError, socket.gaierror))
            or (isinstance(e, OSError) and e.errno in UNREACHABLE_ERRNOS)
        ):
            where = _endpoint(e, storage)
            return f"endpoint unreachable: cannot connect to {where or 'the storage endpoint'}"
    return None


def one_line(exc: BaseException) -> str:
    """The CSV cell for a failure: type and message on one line, for DCP's CheckpointException the first failing
    rank's own exception rather than DCP's text (which holds every rank's traceback)."""
    failures = _dcp_failures(exc)
    if failures:
        rank = min(failures)
        _, message = classify_failure(failures[rank][0])
        return f"{message} (DCP rank {rank})"
    return classify_failure(exc)[1]


def full_text(exc: BaseException) -> str:
    """Everything known about a failure, for the errors log: the traceback, with DCP's per-rank ones."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if _dcp_failures(exc):
        text += str(exc)  # CheckpointException's text is every failing rank's traceback
    return text


def describer(storage: Storage, log: list[str]) -> Callable[[BaseException], tuple[str, str]]:
    """``describe`` for core.dist.Ranks.agree inside one case: (status, one line); the storage's own failures get
    status STORAGE_DOWN; every failure's full text is appended to ``log``."""

    def describe(exc: BaseException) -> tuple[str, str]:
        log.append(full_text(exc))
        reason = storage_down_reason(exc, storage)
        if reason is not None:
            return STORAGE_DOWN, reason
        status, _ = classify_failure(exc)
        return status, one_line(exc)

    return describe
