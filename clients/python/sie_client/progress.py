"""`progress=True`: a tqdm bar of the items a call has had answered (tqdm is the client's `progress` extra)."""

from __future__ import annotations

from typing import Any

from sie_client.extras import needs_extra


class Progress:
    """Items answered so far, out of `total`, as a bar on stderr; does nothing when not `enabled`.

    Made before a call sends anything, so a missing tqdm fails the call before any work."""

    def __init__(self, enabled: bool, total: int, verb: str) -> None:
        self._bar: Any = None
        if enabled:
            with needs_extra("progress=True", "progress", "tqdm"):
                from tqdm.auto import tqdm
            self._bar = tqdm(total=total, unit="item", desc=verb)

    def advance(self, items: int) -> None:
        if self._bar is not None:
            self._bar.update(items)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
