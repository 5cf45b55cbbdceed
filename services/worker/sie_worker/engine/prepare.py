"""CPU preparation: each part of a plan made ready for the device by its adapter's `prepare`: texts together on the
preprocessing threads (on the event loop when few), each image decoded (within the image limits, checked on its
header) and processed on the image pool. Then the bounds that need the prepared items: the multivectors a request
holds, and a multivector answer's size, before anything runs."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from sie_common.edge.answer_size import MAX_SEND_SETTING, check_dense_estimate
from sie_common.edge.errors import InvalidArgument, SieError
from sie_common.runtime.tracing import span
from sie_worker.adapters.contract import Adapter, AdapterError, Input, Prepared
from sie_worker.engine.images import ImageHeader, decode, read_headers
from sie_worker.engine.jobs import ItemInput
from sie_worker.engine.limits import Limits, check_held_multivectors
from sie_worker.engine.plan import Part, RequestPlan
from sie_worker.engine.timing import Clock, ms_since

T = TypeVar("T")

# Requests of at most this many items are tokenized, finished and answered on the event loop (see `off_loop`).
INLINE_ITEMS = 8
# ... and of at most this many characters of text: the tokenizer may read a text whole (one long word, or long
# whitespace before its first word), about 0.5 s per 2 MiB text, which must not hold the event loop.
INLINE_TEXT_CHARS = 32 * 1024


@dataclass(frozen=True)
class PreparedPart:
    """A part's items as its adapter reads them, and made ready for the device (in the part's row order)."""

    inputs: list[Input]
    prepared: list[Prepared]


class Preparation:
    """The CPU stages around the device: the preprocessing threads and the image pool."""

    def __init__(self, limits: Limits, max_send_bytes: int, cpu_workers: int, image_workers: int) -> None:
        self._limits = limits
        self._max_send_bytes = max_send_bytes
        self._cpu_pool = ThreadPoolExecutor(cpu_workers, thread_name_prefix="sie-cpu")
        self._image_pool = ThreadPoolExecutor(image_workers, thread_name_prefix="sie-image")

    def stop(self) -> None:
        self._cpu_pool.shutdown(wait=False, cancel_futures=True)
        self._image_pool.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, work: Callable[[], T], items: int, chars: int = 0) -> T:
        """Run CPU work for `items` items: on the preprocessing threads, so that the event loop serves other
        requests meanwhile, unless they are few. For a few, the hop to a thread and back costs more than the
        work, and beside a bulk neighbour each hop waits for the GIL. `chars`: the text the work reads, if any."""
        if items <= INLINE_ITEMS and chars <= INLINE_TEXT_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._cpu_pool, work)

    async def prepare(self, plan: RequestPlan, clock: Clock) -> list[PreparedPart]:
        """Every part of the plan prepared, together; the first refusal in item order is the one raised (one of the
        whole request, such as its images' pixels, before any item's). Then the multivector bounds."""
        started = time.perf_counter()
        with span("tokenization"):
            outcomes = await _each(self._part(plan.model.adapter, part, plan.items) for part in plan.parts)
        clock.tokenization_ms += ms_since(started)
        refused = [outcome for outcome in outcomes if isinstance(outcome, _Refused)]
        if refused:
            raise min(refused, key=lambda refusal: refusal.row).error
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        prepared = [outcome for outcome in outcomes if isinstance(outcome, PreparedPart)]
        self._check_multivectors(plan, prepared)
        return prepared

    async def _part(self, adapter: Adapter, part: Part, items: Sequence[ItemInput]) -> PreparedPart:
        if part.query.modality == "image":
            return await self._images(adapter, part, items)
        given = [items[row] for row in part.rows]
        inputs = [Input(item.text, None, part.pair) for item in given]
        chars = sum(len(item.text or "") for item in given) + len(part.query.instruction or "") + len(part.pair or "")
        try:
            prepared = await self.off_loop(lambda: adapter.prepare(inputs, part.query), len(inputs), chars)
        except AdapterError as error:
            raise _refused(error, items, part.rows) from None
        return PreparedPart(inputs, prepared)

    async def _images(self, adapter: Adapter, part: Part, items: Sequence[ItemInput]) -> PreparedPart:
        """The part's image headers read (together, against the request's bound), then each image decoded and
        processed on the image pool, in parallel."""
        loop = asyncio.get_running_loop()
        read = functools.partial(read_headers, limits=self._limits, resized_pixels=adapter.resized_pixels)
        try:
            headers = await loop.run_in_executor(self._image_pool, read, [items[row] for row in part.rows])
        except SieError as error:
            raise _Refused(REQUEST, error) from None  # the request's, not an item's: before any item's

        def prepare(row: int, header: ImageHeader) -> tuple[Input, Prepared]:
            try:
                given = Input(header.item.text, decode(header, limits=self._limits), part.pair)
                return given, adapter.prepare([given], part.query)[0]
            except AdapterError as error:
                raise _refused(error, items, (row,)) from None
            except SieError as error:
                raise _Refused(row, error) from None

        outcomes = await asyncio.gather(
            *(loop.run_in_executor(self._image_pool, prepare, *pair) for pair in zip(part.rows, headers, strict=True)),
            return_exceptions=True,
        )
        refused = [outcome for outcome in outcomes if isinstance(outcome, _Refused)]
        if refused:
            raise min(refused, key=lambda refusal: refusal.row)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        pairs = [outcome for outcome in outcomes if isinstance(outcome, tuple)]
        return PreparedPart([given for given, _ in pairs], [ready for _, ready in pairs])

    def _check_multivectors(self, plan: RequestPlan, parts: Sequence[PreparedPart]) -> None:
        """Before the forward pass, from the rows each prepared item yields: RESPONSE_TOO_LARGE when the plan's
        multivectors could not be sent, and INVALID_ARGUMENT when those it computes (for MUVERA too) would be more
        than SIE_MAX_SCORE_MULTIVECTOR_BYTES to hold (an answer may be far smaller than that: MUVERA, a binary
        dtype), so no vectors are computed and held for an answer that cannot go out or that a request may not
        hold."""
        if "multivector" not in plan.device_outputs:
            return
        dims = plan.model.adapter.multivector_dims
        total = 0
        for part, prepared in zip(plan.parts, parts, strict=True):
            if not part.counted:
                continue
            total += sum(item.rows for item in prepared.prepared)
            if "multivector" in plan.outputs:
                check_dense_estimate(total, dims, plan.output_dtype, self._max_send_bytes, MAX_SEND_SETTING)
            check_held_multivectors(total, dims, self._limits, plan.task)


async def _each(steps: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """Every step's outcome or exception, the steps run together; a lone one in the caller's task (no task of its
    own, no turn of the event loop to join it)."""
    awaited = list(steps)
    if len(awaited) != 1:
        return await asyncio.gather(*awaited, return_exceptions=True)
    try:
        return [await awaited[0]]
    except Exception as error:  # noqa: BLE001 - returned, as gather(return_exceptions=True) returns it
        return [error]


class _Refused(Exception):
    """A part's refusal, and the row of the item it names (REQUEST: the whole request's), to raise the first."""

    def __init__(self, row: int, error: SieError) -> None:
        super().__init__(error.message)
        self.row = row
        self.error = error


# The row of a refusal of the whole request (not of one of its items): raised before any item's.
REQUEST = -1


def _refused(error: AdapterError, items: Sequence[ItemInput], rows: Sequence[int]) -> _Refused:
    """What the caller is told of an adapter's refusal: the item it names (by its position among `rows`), by its
    label, where it names one."""
    if error.item is None:
        return _Refused(rows[0], InvalidArgument(error.message, reason=error.reason, metadata=error.metadata))
    row = rows[error.item]
    item = items[row]
    message, metadata = f"{item.label}: {error.message}", {**item.metadata, **error.metadata}
    return _Refused(row, InvalidArgument(message, reason=error.reason, metadata=metadata))
