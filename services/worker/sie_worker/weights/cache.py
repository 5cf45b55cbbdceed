"""The two weight cache tiers: a local directory and a cluster-wide S3 prefix.

Both hold one folder per weights key (`org--name@revision`). A folder counts
only once its completion marker exists, so a copy cut short is never used.
The local cache is trimmed least-recently-used first when its disk is fuller
than SIE_DISK_PRESSURE_THRESHOLD_PERCENT.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

from huggingface_hub import constants as hf_constants

from sie_common.cluster.model_config import ModelConfig
from sie_worker.settings import WorkerSettings
from sie_worker.weights.s3 import S3Location, S3Store

log = logging.getLogger(__name__)

LOCAL_MARKER = ".sie-complete"
CLUSTER_MARKER = "_SIE_COMPLETE"
LOCAL_SUBDIR = "sie-weights"

DiskUsage = Callable[[Path], tuple[int, int]]  # path -> (total bytes, used bytes)


def weights_key(config: ModelConfig) -> str:
    """One folder name per (weights repository, revision); never a path with separators."""
    return f"{config.hf_id or config.id}@{config.revision or 'main'}".replace("/", "--")


def local_cache_root(settings: WorkerSettings) -> Path:
    """The local weight cache: SIE_LOCAL_CACHE, else the Hugging Face hub cache."""
    return Path(settings.local_cache) if settings.local_cache else Path(hf_constants.HF_HUB_CACHE)


def check_local_cache_writable(settings: WorkerSettings) -> None:
    """At start, an OSError that says what to change when the worker will need to write weights to its local cache
    (downloads from the Hub or copies from the cluster cache land there) and cannot: a read-only file system or
    volume, or a directory of another user's. A read-only cache of complete weights is fine without either source."""
    if not (settings.hf_fallback or settings.cluster_cache):
        return
    root = local_cache_root(settings)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".sie-write-check-"):
            pass
    except OSError as error:
        raise OSError(
            f"the local weight cache {root} (SIE_LOCAL_CACHE) is not writable: {error.strerror or error}. The worker "
            "writes the weights it downloads there: mount a writable volume at that path or point SIE_LOCAL_CACHE at "
            "a writable directory (a read-only cache of complete weights needs SIE_HF_FALLBACK=false and no "
            "SIE_CLUSTER_CACHE)"
        ) from error


def _disk_usage(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.total, usage.used


class LocalCache:
    def __init__(
        self, root: Path, *, lru_enabled: bool, pressure_percent: float, disk_usage: DiskUsage = _disk_usage
    ) -> None:
        self.root = root / LOCAL_SUBDIR
        self._lru_enabled = lru_enabled
        self._pressure_percent = pressure_percent
        self._disk_usage = disk_usage

    def folder(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> Path | None:
        """The complete folder for `key`, marked as just used, or None."""
        folder = self.folder(key)
        marker = folder / LOCAL_MARKER
        if not marker.is_file():
            return None
        os.utime(marker)
        return folder

    def fill(self, key: str, write: Callable[[Path], object]) -> Path:
        """Run `write(staging_dir)`, then publish the staging dir as `key` atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".staging-{key}-{uuid.uuid4().hex[:8]}"
        try:
            write(staging)
            (staging / LOCAL_MARKER).touch()
            folder = self.folder(key)
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return folder

    def trim(self, keep: Collection[str]) -> list[str]:
        """Remove least-recently-used folders (not in `keep`) while the disk is over the threshold."""
        if not self._lru_enabled or not self.root.is_dir():
            return []
        entries = sorted(
            (marker.stat().st_mtime, marker.parent.name)
            for marker in self.root.glob(f"*/{LOCAL_MARKER}")
            if marker.parent.name not in keep
        )
        removed = []
        for _, key in entries:
            total, used = self._disk_usage(self.root)
            if total <= 0 or used * 100 / total <= self._pressure_percent:
                break
            shutil.rmtree(self.folder(key), ignore_errors=True)
            removed.append(key)
            log.info("disk over %.0f%%: removed cached weights %s", self._pressure_percent, key)
        return removed


class ClusterCache:
    def __init__(self, store: S3Store, location: S3Location) -> None:
        self._store = store
        self.location = location

    def has(self, key: str) -> bool:
        return self._store.exists(self.location.child(key).child(CLUSTER_MARKER))

    def download(self, key: str, destination: Path) -> None:
        self._store.download_folder(self.location.child(key), destination)
        (destination / CLUSTER_MARKER).unlink(missing_ok=True)

    def upload(self, key: str, source: Path) -> None:
        """Upload a folder, then its marker: readers never see a partial copy."""
        started = time.perf_counter()
        target = self.location.child(key)
        self._store.upload_folder(source, target, skip=frozenset({LOCAL_MARKER}))
        self._store.write_bytes(target.child(CLUSTER_MARKER), b"")
        log.info("uploaded weights %s to %s in %.1f s", key, target, time.perf_counter() - started)
