"""A mirror's stop ends its watch even when a change arrives together with the cancellation.

On Python 3.11, asyncio.wait_for returns the awaited result when that result and the caller's cancellation come in
the same turn of the event loop, and the cancellation is lost: the watch went on and `PrefixMirror.stop` waited for
ever. A gateway stopping while its workers deregistered (their keys' deletions were the changes) hung until SIGKILL:
40 s in about one in three runs of tests/test_gateway.py's kill -9 and bundle-pool tests."""

from __future__ import annotations

import asyncio

from sie_common.cluster.etcd import Etcd
from sie_common.cluster.etcd_mirror import MirrorUpdate, PrefixMirror

ROUNDS = 100


async def test_a_cancel_that_comes_with_a_change_still_ends_the_watch(etcd: Etcd) -> None:
    """Two mirrors of one prefix get the same change in the same turn of the loop; the second's callback cancels
    the first's watch: as often as not, the first's answer has arrived and its task not yet resumed."""
    went_on = 0
    for round_ in range(ROUNDS):
        prefix = f"race-{round_}/"
        victim = PrefixMirror(etcd, prefix)
        await victim.start()
        watching = victim._task
        assert watching is not None

        def cancel_the_victim(update: MirrorUpdate, watching: asyncio.Task[None] = watching) -> None:
            if not update.full_read:
                watching.cancel()

        canceller = PrefixMirror(etcd, prefix, cancel_the_victim)
        await canceller.start()
        await etcd.put(f"{prefix}key", b"changed")
        done, _ = await asyncio.wait({watching}, timeout=2)
        went_on += not done
        await victim.stop()  # cancels again: ends a watch that went on
        await canceller.stop()
    assert went_on == 0, f"{went_on} of {ROUNDS} cancelled watches went on"
