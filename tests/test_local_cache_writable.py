"""The worker refuses to start when it will need to write weights to its local cache and cannot (the container check,
tests/test_manifest_containers.py, runs the image on a read-only file system; these run everywhere)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import check_local_cache_writable


def settings(cache: Path, **changes: object) -> WorkerSettings:
    return dataclasses.replace(WorkerSettings(), local_cache=str(cache), **changes)


def test_a_cache_that_cannot_be_written_stops_the_start_saying_what_to_change(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError) as raised:
        check_local_cache_writable(settings(blocker / "cache"))
    message = str(raised.value)
    assert message.startswith(f"the local weight cache {blocker / 'cache'} (SIE_LOCAL_CACHE) is not writable: ")
    assert "mount a writable volume at that path or point SIE_LOCAL_CACHE at a writable directory" in message


def test_a_missing_cache_directory_is_made_and_nothing_is_left_in_it(tmp_path: Path) -> None:
    cache = tmp_path / "weights" / "cache"
    check_local_cache_writable(settings(cache))
    assert cache.is_dir() and list(cache.iterdir()) == []


def test_a_read_only_cache_is_fine_when_nothing_will_be_downloaded_into_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    check_local_cache_writable(settings(blocker / "cache", hf_fallback=False))
    with pytest.raises(OSError):  # a cluster cache copies weights into it
        check_local_cache_writable(settings(blocker / "cache", hf_fallback=False, cluster_cache="s3://bucket/weights"))
