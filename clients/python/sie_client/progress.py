"""`progress=True`: a tqdm bar of the items a call has had answered (tqdm is the client's `progress` extra)."""

from __future__ import annotations

from typing import Any

# How to install what `progress=True` needs: the extra of the sie-client distribution (clients/python).
PROGRESS_EXTRA_HINT = (
    "progress=True needs tqdm, which the client's `progress` extra installs: "
    "pip install 'sie-client[progress]' (from a checkout: pip install './clients/python[progress]')"
)


class Progress:
    """Items answered so far, out of `total`, as a bar on stderr; does nothing when not `enabled`.

    Made before a call sends anything, so a missing tqdm fails the call before any work."""

    def __init__(self, enabled: bool, total: int, verb: str) -> None:
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ModuleNotFoundError as missing:
                if (missing.name or "").partition(".")[0] != "tqdm":
                    raise
                raise ModuleNotFoundError(PROGRESS_EXTRA_HINT, name="tqdm") from None
            self._bar = tqdm(total=total, unit="item", desc=verb)

    def advance(self, items: int) -> None:
        if self._bar is not None:
            self._bar.update(items)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
