"""Send a request to the best worker, and to another one if that worker is lost.

Inference is idempotent, so a request whose worker dies before answering, or
refuses it because it is shutting down (it drains what it accepted, but the
gateway may not have seen it deregister yet), is sent again to the next best
eligible worker; the caller still gets exactly one answer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sie.v1 import worker_pb2
from sie_common.cluster.cluster_store import WorkerRecord
from sie_common.edge.errors import status_reason
from sie_gateway.demand import DemandRecorder
from sie_gateway.routing import choose_worker
from sie_gateway.worker_link import Connect, WorkerLink, WorkerLost

# A worker's refusal that means "not accepted here, send it elsewhere".
SHUTTING_DOWN = "SHUTTING_DOWN"

# Given the workers already tried, the workers still eligible for this request.
Candidates = Callable[[Collection[str]], Sequence[WorkerRecord]]


class NoWorker(Exception):
    """No eligible worker is left for the request."""

    def __init__(self, tried: Collection[str]) -> None:
        super().__init__(f"no eligible worker (tried: {', '.join(sorted(tried)) or 'none'})")
        self.tried = tuple(tried)


class Dispatcher:
    def __init__(
        self,
        *,
        window: int,
        max_attempts: int = 3,
        connect: Connect | None = None,
        demand: DemandRecorder | None = None,
    ) -> None:
        self._window = window
        self._connect = connect
        self._max_attempts = max_attempts
        self._demand = demand
        self._links: dict[str, WorkerLink] = {}

    def outstanding(self) -> dict[str, int]:
        return {worker_id: link.outstanding for worker_id, link in self._links.items()}

    async def forget_others(self, live: Collection[str]) -> None:
        """Close the links of workers that left the registry; their requests fail over."""
        for worker_id in [worker_id for worker_id in self._links if worker_id not in live]:
            await self._links.pop(worker_id).close()

    async def dispatch(
        self, task: str, message: Any, *, model: str, candidates: Candidates, deadline: float | None
    ) -> worker_pb2.WorkResponse:
        """The answer of the first worker that does not vanish; `deadline` is a time.monotonic() value."""
        tried: set[str] = set()
        for _ in range(self._max_attempts):
            worker = choose_worker(candidates(tried), model, self.outstanding())
            if worker is None:
                break
            timeout_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            serving = (
                self._demand.serving(worker.machine_profile, worker.pool) if self._demand else contextlib.nullcontext()
            )
            try:
                with serving:
                    response = await self._link(worker).call(task, message, timeout_s=timeout_s)
            except WorkerLost:
                tried.add(worker.worker_id)
                continue
            if response.WhichOneof("outcome") == "error" and status_reason(response.error) == SHUTTING_DOWN:
                tried.add(worker.worker_id)
                continue
            return response
        raise NoWorker(tried)

    def _link(self, worker: WorkerRecord) -> WorkerLink:
        link = self._links.get(worker.worker_id)
        if link is None or link.address != worker.address:
            channel = self._connect(worker.address) if self._connect is not None else None
            link = WorkerLink(worker.worker_id, worker.address, window=self._window, channel=channel)
            self._links[worker.worker_id] = link
        return link

    async def close(self) -> None:
        await self.forget_others(())
