"""How a batch that fails (out of device memory, or on one item) is retried in halves, and what its items are told."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sie_common.edge.errors import InvalidArgument, ResourceExhausted, SieError

log = logging.getLogger(__name__)

T = TypeVar("T")


def run_isolating_failures(
    run: Callable[[Sequence[T]], Any],
    items: Sequence[T],
    *,
    is_oom: Callable[[BaseException], bool],
    recover: Callable[[], None] = lambda: None,
) -> list[Any]:
    """`run(items)`, one output per item; when it raises, each half runs separately (recursively), so that a
    failure ends with the items that cause it and the others still get their outputs.

    Out of memory, `recover` runs before the halves do, and a single item that still does not fit fails with
    RESOURCE_EXHAUSTED. An item that fails on its own while others of the batch succeed has the cause in its
    input: INVALID_ARGUMENT (ITEM_FAILED). The failed items' errors stand in their outputs' places; when every
    item fails, the first error is raised for the whole batch, and so is a SieError `run` raises (not split)."""
    outcomes = _run_halving(run, items, is_oom, recover)
    failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if not failed:
        return outcomes
    if len(failed) == len(outcomes):
        raise failed[0]
    return [blame_item(outcome) if isinstance(outcome, BaseException) else outcome for outcome in outcomes]


def _run_halving(
    run: Callable[[Sequence[T]], Any],
    items: Sequence[T],
    is_oom: Callable[[BaseException], bool],
    recover: Callable[[], None],
) -> list[Any]:
    """One outcome per item: its output, or the exception it failed with alone."""
    try:
        return list(run(items))
    except SieError:  # a deliberate answer for the whole batch (a LoRA that cannot load, ...), not an item's fault
        raise
    except Exception as error:  # noqa: BLE001 - whatever else failed the pass, the halves tell which items cause it
        oom = is_oom(error)
        if oom:
            recover()
        if len(items) == 1:
            if oom:
                return [
                    ResourceExhausted(
                        f"out of device memory on a single item ({error}); send shorter inputs or free the device",
                        reason="DEVICE_OUT_OF_MEMORY",
                    )
                ]
            return [error]
        log.warning(
            "%s on a batch of %d items; retrying in halves", "out of memory" if oom else f"error ({error})", len(items)
        )
        middle = len(items) // 2
        return _run_halving(run, items[:middle], is_oom, recover) + _run_halving(run, items[middle:], is_oom, recover)


def blame_item(error: BaseException, *, because: str = "the other items of its batch succeeded") -> SieError:
    """An item's own failure (`because` says why the model is not to blame): INVALID_ARGUMENT unless it already is
    a SieError."""
    if isinstance(error, SieError):
        return error
    return InvalidArgument(
        f"the model failed on this item ({type(error).__name__}: {error}) while {because}; check the item's input",
        reason="ITEM_FAILED",
    )
