"""The etcd prefix mirror: deltas after a full read, resume after a broken stream, full read after compaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie_common.cluster.etcd import Etcd
from sie_common.cluster.etcd_mirror import MirrorUpdate, PrefixMirror
from sie_stack.processes import EtcdProcess


def assert_applied_once_in_order(updates: list[MirrorUpdate]) -> None:
    revisions = [update.revision for update in updates]
    assert revisions == sorted(set(revisions)), f"revisions not strictly increasing: {revisions}"
    for update in updates:
        assert all(change.revision <= update.revision for change in update.changes)


async def fresh_state(etcd: Etcd, prefix: str) -> dict[str, bytes]:
    fresh = PrefixMirror(etcd, prefix)
    await fresh.start()
    await fresh.stop()
    return fresh.state


async def test_watcher_disconnected_through_a_compaction_ends_with_a_fresh_reads_state(etcd: Etcd) -> None:
    await etcd.put("models/a", b"a1")
    await etcd.put("models/b", b"b1")
    updates: list[MirrorUpdate] = []
    mirror = PrefixMirror(etcd, "models/", updates.append)
    await mirror.start()
    await mirror.wait_for(await etcd.put("models/c", b"c1"), timeout_s=10)
    assert mirror.state == {"a": b"a1", "b": b"b1", "c": b"c1"}
    assert [u.full_read for u in updates] == [True, False]

    await mirror.stop()  # disconnected; meanwhile the keys change and etcd compacts that history
    await etcd.put("models/a", b"a2")
    await etcd.delete("models/b")
    await etcd.put("outside/x", b"not mirrored")
    compacted_at = await etcd.put("models/d", b"d1")
    await etcd.compact(compacted_at)

    await mirror.start()  # the watch from the old revision is refused: a full read replaces the state
    await mirror.wait_for(compacted_at, timeout_s=10)
    after = await etcd.put("models/e", b"e1")
    await mirror.wait_for(after, timeout_s=10)

    expected = {"a": b"a2", "c": b"c1", "d": b"d1", "e": b"e1"}
    assert mirror.state == await fresh_state(etcd, "models/") == expected
    assert mirror.full_reads == 2
    assert updates[-1].changes[0].name == "e" and not updates[-1].full_read  # deltas again after the re-read
    assert_applied_once_in_order(updates)


@pytest.mark.process
async def test_watcher_resumes_from_its_revision_after_etcd_restarts(tmp_path: Path) -> None:
    server = EtcdProcess(tmp_path / "data", tmp_path / "etcd.log")
    server.start()
    etcd = Etcd([server.endpoint], "/sie/")
    try:
        await etcd.connect()
        await etcd.put("models/a", b"a1")
        updates: list[MirrorUpdate] = []
        mirror = PrefixMirror(etcd, "models/", updates.append, retry_s=0.2)
        await mirror.start()
        seen = mirror.revision

        server.stop()  # the watch stream breaks; the mirror keeps retrying from its revision
        server.start()
        await etcd.put("models/b", b"b1")
        after = await etcd.put("models/a", b"a2")
        await mirror.wait_for(after, timeout_s=30)

        assert mirror.state == {"a": b"a2", "b": b"b1"} == await fresh_state(etcd, "models/")
        assert mirror.full_reads == 1  # resumed, not re-read
        changes = [(change.name, change.revision) for update in updates for change in update.changes]
        assert [name for name, _ in changes] == ["b", "a"] and all(revision > seen for _, revision in changes)
        assert_applied_once_in_order(updates)
        await mirror.stop()
    finally:
        await etcd.close()
        server.stop()
