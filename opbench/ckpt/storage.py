"""Where checkpoints go: a local directory or any fsspec URL (s3://, gs://, memory://, file://).

A plain path uses DCP's FileSystemWriter/Reader and the OS directly (the fast path trainers use on local or
parallel file systems); a URL goes through fsspec (DCP's FsspecWriter/Reader, fsspec.open for torch.save).
Endpoint and credentials come from the environment and fsspec config as usual (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, FSSPEC_S3_ENDPOINT_URL, ~/.config/fsspec) or from --storage-options.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opbench.core.errors import UsageError, describe_os_error
from opbench.core.inputs import parse_json

# Object storage through botocore (s3fs): two attempts per request, "standard" retry mode (backoff on
# throttling, 5xx and connection errors). botocore's default (legacy mode, 5 attempts) spends seconds per request on
# an endpoint that is gone, and every call of every case pays it. Throttling (SlowDown) and dropped connections are
# also retried by s3fs itself (5 tries). --storage-options' own config_kwargs win.
S3_RETRIES = {"max_attempts": 2, "mode": "standard"}
S3_PROTOCOLS = ("s3", "s3a")

# Checked before anything is written: room for this many iterations of the checkpoint (they are all kept
# until the loads are done), times a little slack for metadata.
FREE_SPACE_SLACK = 1.05


@dataclass(frozen=True)
class Storage:
    """One --storage entry. ``spec`` is what the user typed (the CSV's storage column)."""

    spec: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_url(self) -> bool:
        return "://" in self.spec

    @property
    def protocol(self) -> str:
        return self.spec.split("://", 1)[0].lower() if self.is_url else "local"

    @property
    def local_root(self) -> str | None:
        """The directory on this machine's file system, for a path or file:// URL (page-cache eviction)."""
        if not self.is_url:
            return os.path.abspath(os.path.expanduser(self.spec))
        if self.protocol in ("file", "local"):
            return "/" + self.spec.split("://", 1)[1].lstrip("/")
        return None

    @property
    def root(self) -> str:
        local = self.local_root
        return local if local is not None and not self.is_url else self.spec.rstrip("/")

    @property
    def bucket(self) -> str:
        """The bucket (first path part) of an object-storage URL; '' for a path."""
        return self.spec.split("://", 1)[1].split("/", 1)[0] if self.is_url else ""

    @property
    def fs_options(self) -> dict[str, Any]:
        """What the fsspec file system is built with: --storage-options, and for S3 a bounded botocore retry
        policy (S3_RETRIES) unless the options give their own ``config_kwargs.retries``."""
        options = dict(self.options)
        config = options.get("config_kwargs")
        if self.protocol in S3_PROTOCOLS and (config is None or isinstance(config, dict)):
            options["config_kwargs"] = {"retries": dict(S3_RETRIES), **(config or {})}
        return options

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def filesystem(self):
        """(fsspec filesystem, path inside it) for this storage; local paths use fsspec's LocalFileSystem."""
        from fsspec.core import url_to_fs

        try:
            return url_to_fs(self.root, **self.fs_options)
        except (ImportError, ValueError) as exc:
            raise UsageError(
                f"no fsspec file system for '{self.protocol}://' ({exc})", source=self.spec, field="--storage"
            ) from None

    def check_protocol(self) -> None:
        """Fail now, with one line, when fsspec has no file system for this URL's protocol (or its package is not
        installed): a --dry-run plan should not list cases that can never run. Connects to nothing."""
        if not self.is_url:
            return
        from fsspec.registry import get_filesystem_class

        try:
            get_filesystem_class(self.protocol)
        except (ImportError, ValueError) as exc:
            raise UsageError(
                f"no fsspec file system for '{self.protocol}://' ({exc})", source=self.spec, field="--storage"
            ) from None

    def local_path(self, url: str) -> str | None:
        """``url`` (made by join) as a local file name, or None for remote storage."""
        if self.local_root is None:
            return None
        return url.split("://", 1)[1] if "://" in url else url


def parse_storage_options(text: str | None) -> dict[str, Any]:
    """--storage-options: a JSON object passed to the fsspec file system (e.g. endpoint_url, default_block_size)."""
    if not text:
        return {}
    value = parse_json(text, field="--storage-options")
    if not isinstance(value, dict):
        raise UsageError('must be a JSON object like {"default_block_size": 5242880}', field="--storage-options")
    return value


def preflight(storage: Storage, world_size: int, needed_bytes: int) -> str:
    """Check, before anything is measured, that the storage exists, is writable and (locally) has room for
    ``needed_bytes``. Returns the run's root directory; raises UsageError naming the storage otherwise."""
    if storage.protocol == "memory" and world_size > 1:
        raise UsageError(
            "memory:// is private to each process, so ranks cannot share a checkpoint there; use it with one process",
            source=storage.spec,
            field="--storage",
        )
    fs, _ = storage.filesystem()
    run_dir = storage.join(f"opbench_ckpt_{uuid.uuid4().hex[:12]}")
    probe = run_dir + "/.write_probe"
    if storage.protocol in S3_PROTOCOLS and not storage.bucket:
        raise UsageError("an s3:// URL needs a bucket (s3://bucket/prefix)", source=storage.spec, field="--storage")
    try:
        if storage.protocol in S3_PROTOCOLS:
            # S3's own answer names what is wrong (NoSuchBucket, InvalidAccessKeyId, AccessDenied, no connection);
            # fs.exists would say False for all of them, and HeadBucket answers a bare 403/404
            fs.call_s3("list_objects_v2", Bucket=storage.bucket, MaxKeys=1)
        fs.makedirs(run_dir, exist_ok=True)
        fs.pipe_file(probe, b"opbench write probe")
        fs.rm_file(probe)
    except Exception as exc:  # noqa: BLE001 - any failure here is the user's storage, reported as one line
        from .failures import storage_down_reason

        reason = storage_down_reason(exc, storage) or f"cannot write there: {describe_os_error(exc)}"
        raise UsageError(reason, source=storage.spec, field="--storage") from None
    if storage.local_root is not None:
        free = shutil.disk_usage(storage.local_path(run_dir) or run_dir).free
        if free < needed_bytes * FREE_SPACE_SLACK:
            remove_tree(storage, run_dir)
            raise UsageError(
                f"needs {needed_bytes * FREE_SPACE_SLACK / 2**30:.2f} GiB free for the saved "
                f"iterations, has {free / 2**30:.2f} GiB (lower --iterations or the state size)",
                source=storage.spec,
                field="--storage",
            )
    return run_dir


def folder_size(storage: Storage, path: str) -> int:
    """Bytes of every file under ``path`` (Primus' iter_folder_size)."""
    fs, _ = storage.filesystem()
    return int(fs.du(_fs_path(storage, path), total=True))


def corrupt_rank_files(storage: Storage, path: str, rank: int) -> list[str]:
    """Flip one byte in the middle of each file ``rank`` saved under ``path`` (torch_save's rank_NNNNN.pt,
    DCP's __RANK_*.distcp): the ``corrupt`` fault of core.faults. Returns the files changed."""
    fs, _ = storage.filesystem()
    changed = []
    for name in sorted(fs.find(_fs_path(storage, path))):
        base = name.rsplit("/", 1)[-1]
        if base == f"rank_{rank:05d}.pt" or base.startswith(f"__{rank}_"):
            data = bytearray(fs.cat_file(name))
            if data:
                data[len(data) // 2] ^= 0xFF
                fs.pipe_file(name, bytes(data))
                changed.append(name)
    return changed


def remove_tree(storage: Storage, path: str) -> None:
    fs, _ = storage.filesystem()
    target = _fs_path(storage, path)
    if fs.exists(target):
        fs.rm(target, recursive=True)


def drop_page_cache(storage: Storage, path: str) -> bool:
    """Evict every file under ``path`` from this machine's page cache (fsync first: dirty pages are not evicted).
    posix_fadvise(DONTNEED) needs no root. Returns False where it cannot apply (remote storage, no fadvise)."""
    root = storage.local_path(path)
    if root is None or not hasattr(os, "posix_fadvise"):
        return False
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


def _fs_path(storage: Storage, path: str) -> str:
    """The path fsspec's file system takes: a local path for local storage, the URL otherwise."""
    return storage.local_path(path) or path
