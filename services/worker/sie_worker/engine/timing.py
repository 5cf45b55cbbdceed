"""Where a request's time went: its clock, and the Timing its answer carries."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sie_worker.engine.device import ItemResult
from sie_worker.engine.jobs import Timing


@dataclass
class Clock:
    """A request's clock, from when it arrived."""

    started: float
    # Whether the answer carries the statistics of its batches.
    debug: bool = False
    tokenization_ms: float = 0.0
    postprocessing_ms: float = 0.0

    def timing(self, results: Sequence[ItemResult]) -> Timing:
        batches = {batch.batch_id: batch for result in results for batch in (*result.earlier, result.batch)}
        return Timing(
            queue_ms=max((result.queue_ms for result in results), default=0.0),
            tokenization_ms=self.tokenization_ms,
            inference_ms=sum(batch.inference_ms for batch in batches.values()),
            postprocessing_ms=self.postprocessing_ms,
            total_ms=ms_since(self.started),
            batches=tuple(batches[batch_id] for batch_id in sorted(batches)) if self.debug else (),
        )


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000
