"""The device loop: items queued in the BatchFormer, batches handed to the one device thread, outputs fanned back.

While one batch runs on the device the next is formed and queued behind it, so the device goes from one forward
pass to the next without waiting on the event loop; until it starts, a batch led by a request that came after it
was formed takes its place (fair queuing, sie_worker.batching.former). Each loaded model's batch policy
(sie_worker.batching.adaptive, made when the model first batches) sets the wait and token budget its batches are
formed under. Out of memory, or failing on an item, a batch is retried in halves (sie_worker.models.batch_retry);
a generation that pauses after a slice (`Continued`) is queued again, behind the batches queued meanwhile.

On a CPU, a lone small request that finds nothing queued and the device thread idle, with its batch ready at once
(the model's batch wait is 0), may run its forward pass right away on the event loop's thread, on one torch thread,
where its model measured that faster at its size than the device thread (sie_worker.engine.threads): no thread
hop either way. Its batch goes through the former and is answered as any other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sie_common.edge.errors import Internal, SieError
from sie_common.runtime.tracing import record_span, recording
from sie_worker.adapters.contract import Continued
from sie_worker.batching.adaptive import BatchPolicy, batching_for
from sie_worker.batching.former import Batch, BatchFormer, BatchLimits, PendingItem
from sie_worker.batching.stats import BatchStats, describe, publish_setting, record
from sie_worker.engine.batch_key import BatchKey
from sie_worker.engine.threads import DEVICE, INLINE, InlineChoice, pin_threads
from sie_worker.metrics import QUEUE_DEPTH, record_batch
from sie_worker.models.batch_retry import blame_item, run_isolating_failures
from sie_worker.models.build import LoadedModel
from sie_worker.models.memory import is_cuda_oom, release_cuda_cache
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# Batches handed to the device thread at once: the one running and the next, formed behind it.
PIPELINE_DEPTH = 2
# A batch's forward pass: one output per prepared value, as a list or as the rows of an array (a scorer's scores).
Forward = Callable[[Sequence[Any]], Sequence[Any] | np.ndarray]


@dataclass(frozen=True)
class DeviceWork:
    """What a batch runs: `forward` over its items' prepared values, with one LoRA adapter active, under the model's
    batch policy; on a CPU, with the model's measurements of where its small passes run faster."""

    model: LoadedModel
    policy: BatchPolicy
    lora: str
    forward: Forward
    inline: InlineChoice | None = None


class DeviceThread(ThreadPoolExecutor):
    """The one thread that runs device work (forward passes, LoRA loads), knowing whether any is submitted and not
    finished."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="sie-device")
        self._lock = threading.Lock()
        self._unfinished = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            self._unfinished += 1
        try:
            submitted = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        submitted.add_done_callback(self._finished)
        return submitted

    @property
    def idle(self) -> bool:
        return self._unfinished == 0

    def _finished(self, _: Future | None) -> None:
        with self._lock:
            self._unfinished -= 1


@dataclass(frozen=True)
class DeviceItem:
    """What one queued item carries to the device: the work it is part of and its prepared value (for a generation
    that paused, its `Continued`), with what its earlier slices took: their batches and its waits."""

    work: DeviceWork
    value: Any
    earlier: tuple[BatchStats, ...] = ()
    waited_ms: float = 0.0


@dataclass(frozen=True)
class ItemResult:
    output: Any
    batch: BatchStats
    # Waits for the device, before its batch and (a generation) before each later slice.
    queue_ms: float
    tokens: int
    # A generation's slices before the last (`batch`).
    earlier: tuple[BatchStats, ...] = ()


@dataclass(frozen=True)
class _Handed:
    """A batch handed to the device thread, and its pass there (cancellable until it starts)."""

    work: DeviceWork
    batch: Batch[DeviceItem]
    running: Future


class DeviceLoop:
    """Forms batches of queued items and runs them on the device thread, at most PIPELINE_DEPTH at a time."""

    def __init__(self, settings: WorkerSettings, device_thread: DeviceThread, device: torch.device) -> None:
        self._settings = settings
        self._device_thread = device_thread
        self._former: BatchFormer[DeviceItem] = BatchFormer()
        # Each loaded model's batch policy, for as long as it stays loaded (a reload starts afresh).
        self._policies: weakref.WeakKeyDictionary[LoadedModel, BatchPolicy] = weakref.WeakKeyDictionary()
        # On a CPU, each loaded model's measurements of where its small passes run (None: not measured here).
        self._inline: weakref.WeakKeyDictionary[LoadedModel, InlineChoice] | None = (
            weakref.WeakKeyDictionary() if device.type == "cpu" else None
        )
        self._device_threads = torch.get_num_threads()
        self._pinned = False
        self._slots = asyncio.Semaphore(PIPELINE_DEPTH)
        # Batches handed to the device thread whose outputs have not been fanned out yet.
        self._handed = 0
        self._batches = 0

    async def pin_threads(self) -> None:
        """On a CPU, before anything runs: torch on one thread on the event loop's thread, on all of them on the
        device thread (set last, so threads started later, such as model builds', start with all of them)."""
        if self._inline is None:
            return
        pin_threads(1)
        await asyncio.get_running_loop().run_in_executor(self._device_thread, pin_threads, self._device_threads)
        self._pinned = True

    def unpin_threads(self) -> None:
        """The event loop's thread back on all torch threads (an engine stopped in a process that goes on)."""
        if self._pinned:
            self._pinned = False
            pin_threads(self._device_threads)

    def work(self, model: LoadedModel, lora: str, forward: Forward) -> DeviceWork:
        """`forward` on `model` with `lora`, under the model's batch policy."""
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = batching_for(self._settings, model.config.profile(model.profile))
        inline = None
        if self._inline is not None:
            inline = self._inline.get(model)
            if inline is None:
                inline = self._inline[model] = InlineChoice(self._device_threads)
        return DeviceWork(model, policy, lora, forward, inline)

    async def run(
        self, work: DeviceWork, key: BatchKey, values: Sequence[Any], costs: Sequence[int]
    ) -> list[ItemResult]:
        """Each value's output, once the batches that carry them have run; cancelled, its items leave the former."""
        loop = asyncio.get_running_loop()
        pending = [
            PendingItem(key, cost, DeviceItem(work, value), loop.create_future())
            for value, cost in zip(values, costs, strict=True)
        ]
        self._former.add(pending, work.policy)
        if self._runs_inline(work, pending):
            batch = self._former.take_ready()
            if batch is not None:
                self._run_inline(work, batch)
        QUEUE_DEPTH.set(self._former.pending)
        try:
            results = list(await asyncio.gather(*(item.future for item in pending)))
        except BaseException:
            for item in pending:
                item.future.cancel()
            self._former.discard(pending)
            QUEUE_DEPTH.set(self._former.pending)  # else it stays at what was queued until the next batch forms
            raise
        if recording():
            _record_device_spans(pending, results)
        return results

    def _runs_inline(self, work: DeviceWork, pending: Sequence[PendingItem[DeviceItem]]) -> bool:
        """Whether `pending`, one request's items just queued, run now on the event loop (module docstring): nothing
        else is queued, handed or on the device thread, and the model measured it faster at their size."""
        if work.inline is None or not self._pinned or self._handed or not self._device_thread.idle:
            return False
        if self._former.pending != len(pending):
            return False
        return work.inline.inline(len(pending) * max(item.cost for item in pending))

    def _run_inline(self, work: DeviceWork, batch: Batch[DeviceItem]) -> None:
        """Run `batch` on this thread (the event loop's) and answer its items."""
        self._batches += 1
        running: Future = Future()
        try:
            outputs, started, finished = _forward(work, batch)
        except Exception as error:  # noqa: BLE001 - answered per item, as a pass on the device thread
            running.set_exception(error)
        else:
            running.set_result((outputs, started, finished))
            if work.inline is not None:
                work.inline.observe(batch.padded_tokens, INLINE, finished - started)
        self._deliver(work, batch, self._batches, running)

    async def serve(self) -> None:
        """Form batches and hand them to the device thread, at most PIPELINE_DEPTH at a time (a background task)."""
        loop = asyncio.get_running_loop()
        slots = self._slots
        behind: _Handed | None = None
        while True:
            if (
                behind is not None
                and slots.locked()
                and not behind.running.done()
                and self._former.may_displace(behind.batch)
            ):
                batch = await self._instead_of(behind, slots)
            else:
                await slots.acquire()
                batch = await self._former.next_batch()
            QUEUE_DEPTH.set(self._former.pending)
            work = batch[0].payload.work
            # A pass handed to an idle device thread is timed until its outputs are back here, the hops included:
            # what a lone request would wait for there, set against a pass on the event loop (engine.threads).
            alone = work.inline is not None and not self._handed and self._device_thread.idle
            self._batches += 1
            self._handed += 1
            handed_at = time.monotonic() if alone else None
            running = self._device_thread.submit(_forward, work, batch)
            deliver = functools.partial(self._delivered, work, batch, self._batches, handed_at)
            running.add_done_callback(functools.partial(_deliver_unless_cancelled, loop, deliver))
            behind = _Handed(work, batch, running)

    def _delivered(
        self, work: DeviceWork, batch: Batch[DeviceItem], batch_id: int, handed_at: float | None, running: Future
    ) -> None:
        """A batch back from the device thread: its slot free again, its outputs fanned out; `handed_at`: when it
        was handed to an idle device thread (None: not timed for the choice of where small passes run)."""
        self._slots.release()
        self._handed -= 1
        if handed_at is not None and work.inline is not None and not running.cancelled() and not running.exception():
            work.inline.observe(batch.padded_tokens, DEVICE, time.monotonic() - handed_at)
        self._deliver(work, batch, batch_id, running)

    async def _instead_of(self, behind: _Handed, slots: asyncio.Semaphore) -> Batch[DeviceItem]:
        """The next batch to hand over while `behind` waits for the device behind the running batch, with a slot
        held for it: a batch led by a request that came after `behind` was formed takes its place if it has not
        started (its items go back to the former), so a new request waits for one batch of a bulk neighbour, not
        two; else, once a slot frees, the next batch as usual."""
        slot = asyncio.ensure_future(slots.acquire())
        newer = asyncio.ensure_future(self._former.next_batch(newer_than=behind.batch.flows))
        try:
            await asyncio.wait({slot, newer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (slot, newer):
                if not task.done():
                    task.cancel()
        if newer.done() and not newer.cancelled():
            if behind.running.cancel():
                self._handed -= 1  # its delivery will not come
                self._former.give_back(behind.batch, behind.work.policy)
                if slot.done() and not slot.cancelled():
                    slots.release()  # the batch given back holds a slot already, now this one's
            elif not (slot.done() and not slot.cancelled()):
                await slots.acquire()
            return newer.result()
        return await self._former.next_batch()

    def _deliver(self, work: DeviceWork, batch: Batch[DeviceItem], batch_id: int, running: Future) -> None:
        """Fan a finished forward pass out to its items; should that fail, its items fail INTERNAL rather than wait
        for ever (a callback's exception reaches no caller)."""
        try:
            self._fan_out(work, batch, batch_id, running)
        except Exception as error:
            log.exception("answering a forward pass of %d items on %s failed", len(batch), work.model.config.id)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(
                        Internal(f"answering the forward pass failed: {error}", reason="INFERENCE_FAILED")
                    )

    def _fan_out(self, work: DeviceWork, batch: Batch[DeviceItem], batch_id: int, running: Future) -> None:
        """Fan a finished forward pass out to its items, and tell the model's batch policy how it went."""
        model = work.model
        if running.cancelled():
            for item in batch:
                item.future.cancel()
            return
        error = running.exception()
        if error is not None:
            log.error("forward pass of %d items on %s failed", len(batch), model.config.id, exc_info=error)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(_answer_for(error, model, len(batch)))
            return
        outputs, started, finished = running.result()
        model.stats.forward_passes += 1
        record_batch(model.config.id, model.profile, len(batch), batch.tokens, finished - started)
        stats = describe(batch_id, batch, work.policy, started, finished)
        work.policy.observe(batch, started, finished)
        publish_setting(model.config.id, model.profile, work.policy)
        if self._settings.instrumentation:
            record(model.config.id, model.profile, stats)
        paused: list[PendingItem[DeviceItem]] = []
        for row, item in enumerate(batch):
            if item.future.done():
                continue
            if isinstance(outputs[row], BaseException):  # the forward pass failed on this item alone
                item.future.set_exception(_answer_for(outputs[row], model, len(batch)))
                continue
            carried = item.payload
            waited_ms = carried.waited_ms + (started - item.enqueued_at) * 1000
            if isinstance(outputs[row], Continued):
                earlier = (*carried.earlier, stats)
                item.payload = dataclasses.replace(carried, value=outputs[row], earlier=earlier, waited_ms=waited_ms)
                paused.append(item)
            else:
                item.future.set_result(ItemResult(outputs[row], stats, waited_ms, item.cost, carried.earlier))
        if paused:
            self._continue(paused, batch_id)

    def _continue(self, paused: list[PendingItem[DeviceItem]], batch_id: int) -> None:
        """Queue again, as one flow of a group of their own, the items whose generation paused after a slice: their
        tags start at the current virtual time, so the batches of requests that came meanwhile run first, then the
        slice after (the group is ready at once and takes all of them)."""
        for item in paused:
            item.key = ("continued", batch_id)
        costs = [item.cost for item in paused]
        self._former.add(paused, BatchLimits(len(paused), len(paused) * max(costs), max_wait_s=0.0))
        QUEUE_DEPTH.set(self._former.pending)


def _deliver_unless_cancelled(loop: asyncio.AbstractEventLoop, deliver: Callable[[Future], None], done: Future) -> None:
    """A finished forward pass goes back to the event loop (from the device thread) unless it was cancelled."""
    if not done.cancelled():
        loop.call_soon_threadsafe(deliver, done)


def _forward(work: DeviceWork, batch: Batch[DeviceItem]) -> tuple[Sequence[Any], float, float]:
    """Run one batch, under torch.inference_mode (on the device thread, or on the event loop's): its outputs (or,
    for an item the pass failed on, the error) and when the pass started and finished (time.monotonic)."""
    started = time.monotonic()
    with torch.inference_mode():
        outputs = run_isolating_failures(
            lambda values: work.model.loras.run(work.lora, work.forward, values),
            [item.payload.value for item in batch],
            is_oom=is_cuda_oom,
            recover=release_cuda_cache,
        )
    finished = time.monotonic()
    return outputs, started, finished


def _answer_for(error: BaseException, model: LoadedModel, items: int) -> SieError:
    """What a caller is told when a forward pass of `items` items failed on every one: a SieError as it is; a lone
    item on a model that has completed passes is to blame itself (ITEM_FAILED, as when other items of its batch
    succeed: whether it shared a batch must not change its answer); anything else INTERNAL."""
    if items == 1 and model.stats.forward_passes > 0:
        return blame_item(error, because="the model answers other items")
    if isinstance(error, SieError):
        return error
    return Internal(f"inference failed on {model.config.id}: {error}", reason="INFERENCE_FAILED")


def _record_device_spans(pending: Sequence[PendingItem[DeviceItem]], results: Sequence[ItemResult]) -> None:
    """A request's `queue` span (until its last item reached the device) and one `inference` span per
    forward pass that ran its items. A forward pass serves many requests: each request's trace gets its
    own span for it, with the batch id as attribute, rather than a span shared across traces."""
    batches: dict[int, tuple[float, float]] = {}
    for item, result in zip(pending, results, strict=True):
        batches[result.batch.batch_id] = (item.enqueued_at + result.queue_ms / 1000, result.batch.inference_ms / 1000)
    enqueued = min(item.enqueued_at for item in pending)
    record_span("queue", enqueued, max(start for start, _ in batches.values()), {"sie.items": len(pending)})
    for batch_id, (start, seconds) in sorted(batches.items()):
        items = sum(1 for result in results if result.batch.batch_id == batch_id)
        record_span("inference", start, start + seconds, {"sie.batch_id": batch_id, "sie.items": items})
