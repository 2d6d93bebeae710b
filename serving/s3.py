"""Download a model folder from s3://bucket/prefix/ before the engine starts.

Uses boto3's transfer manager: files are fetched in parallel (and large ones in
parallel parts), a file already present with the same size is skipped, so a
restarted container resumes instead of starting over. The endpoint comes from
boto3's own configuration (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 included), so
an S3-compatible server works without code here.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger("serving.s3")

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip", ".tar.bz2", ".tar.xz")


class S3SourceError(RuntimeError):
    """The S3 location cannot be served as a model folder; the message says why and what to do."""


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # "" or ends with "/"

    @classmethod
    def parse(cls, url: str) -> "S3Url":
        if not url.startswith("s3://"):
            raise S3SourceError(f"{url!r} is not an s3:// URL")
        rest = url[len("s3://"):]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise S3SourceError(f"{url!r} names no bucket (expected s3://bucket/prefix/)")
        if key and not key.endswith("/") and not key.lower().endswith(ARCHIVE_SUFFIXES):
            key += "/"
        return cls(bucket, key)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def _client():
    import boto3
    from botocore.config import Config

    # Enough connections for the transfer manager's threads.
    return boto3.client("s3", config=Config(max_pool_connections=32, retries={"mode": "standard"}))


def list_objects(client, url: S3Url) -> list[tuple[str, int]]:
    objs = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=url.prefix):
        for o in page.get("Contents", []):
            if not o["Key"].endswith("/"):  # folder markers made by consoles
                objs.append((o["Key"], o["Size"]))
    return objs


class _Progress:
    """Logs download progress every ~10% (not per chunk: logs stay readable for 100 GB models)."""

    def __init__(self, total: int, files: int):
        self.total, self.files, self.done, self.lock, self.next_pct = max(total, 1), files, 0, threading.Lock(), 10

    def __call__(self, n: int) -> None:
        with self.lock:
            self.done += n
            pct = self.done * 100 // self.total
            if pct >= self.next_pct:
                log.info("download %d%% (%.1f of %.1f MiB, %d files)", pct, self.done / 2**20, self.total / 2**20,
                         self.files)
                self.next_pct = (pct // 10 + 1) * 10


def download(url_text: str, dest: Path, max_concurrency: int = 16, client=None) -> Path:
    """Mirror s3://bucket/prefix/ into dest; return dest."""
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager
    from s3transfer.subscribers import BaseSubscriber

    url = S3Url.parse(url_text)
    if url.prefix.lower().endswith(ARCHIVE_SUFFIXES):
        raise S3SourceError(
            f"{url} is a single archive; this container serves an uncompressed model folder. Point model_id at "
            f"the prefix that holds config.json and the weights (upload the files unpacked), or let SageMaker "
            f"unpack the archive into /opt/ml/model (ModelDataUrl) and leave model_id unset.")
    client = client or _client()
    objs = list_objects(client, url)
    if not objs:
        raise S3SourceError(f"{url} holds no objects: check the bucket, the prefix (it is case-sensitive) and "
                            f"that the credentials may list it")
    if len(objs) == 1 and objs[0][0].lower().endswith(ARCHIVE_SUFFIXES):
        raise S3SourceError(f"{url} holds only the archive {objs[0][0]}; upload the model files unpacked, or let "
                            f"SageMaker unpack it into /opt/ml/model and leave model_id unset.")

    dest.mkdir(parents=True, exist_ok=True)
    todo = []
    for key, size in objs:
        rel = PurePosixPath(key[len(url.prefix):])
        if rel.is_absolute() or ".." in rel.parts:
            raise S3SourceError(f"refusing object key {key!r}: it would be written outside {dest}")
        path = dest.joinpath(*rel.parts)
        if path.is_file() and path.stat().st_size == size:
            continue  # already here from an earlier start
        todo.append((key, size, path))
    _remove_partial_files(dest, {path for _, _, path in todo})
    skipped = len(objs) - len(todo)
    total = sum(s for _, s, _ in todo)
    log.info("downloading %s -> %s: %d files, %.1f MiB (%d already present)", url, dest, len(todo), total / 2**20,
             skipped)
    progress = _Progress(total, len(todo))

    class _Sub(BaseSubscriber):
        def on_progress(self, future, bytes_transferred, **kwargs):
            progress(bytes_transferred)

    config = TransferConfig(max_concurrency=max_concurrency, multipart_chunksize=64 * 2**20)
    futures = []
    with TransferManager(client, config) as tm:
        for key, _, path in todo:
            path.parent.mkdir(parents=True, exist_ok=True)
            # s3transfer writes to a temporary name and renames at the end, so an
            # interrupted download never leaves a full-size partial file to skip later.
            futures.append((key, tm.download(url.bucket, key, str(path), subscribers=[_Sub()])))
        errors = []
        for key, fut in futures:
            try:
                fut.result()
            except Exception as e:  # collect every failure, report once
                errors.append(f"{key}: {e}")
    if errors:
        raise S3SourceError(f"{len(errors)} of {len(todo)} downloads from {url} failed; first: {errors[0]}")
    log.info("download of %s complete (%d files fetched, %d skipped)", url, len(todo), skipped)
    return dest


# s3transfer writes each file to "<name>.<8 hex digits>" and renames it when complete.
_PARTIAL = re.compile(r"^(?P<name>.+)\.[0-9a-fA-F]{8}$")


def _remove_partial_files(dest: Path, pending: set[Path]) -> None:
    """Delete what an interrupted earlier start left half-written: temporary files of the objects
    still to fetch. Nothing else in dest is touched, and a final name only ever holds a complete
    file (the rename happens after the last byte), so the engine never sees a partial one."""
    folders = {p.parent for p in pending}
    for folder in folders:
        if not folder.is_dir():
            continue
        for f in folder.iterdir():
            m = _PARTIAL.match(f.name)
            if m and f.is_file() and folder / m["name"] in pending:
                log.info("removing %s, left half-written by an interrupted download", f)
                f.unlink()


def default_download_dir(url_text: str, cache_dir: Path) -> Path:
    url = S3Url.parse(url_text)
    safe = (url.bucket + "/" + url.prefix).strip("/").replace("/", "--")
    return Path(os.path.join(cache_dir, "s3", safe))
