"""Send a request to the best worker, and to another one if that worker is lost or cold.

Inference is idempotent, so a request whose worker dies before answering, or
refuses it because it is shutting down (it drains what it accepted, but the
gateway may not have read its record saying so yet), is sent again to the next
best eligible worker; the caller still gets exactly one answer. So is a request
refused with MODEL_LOADING (or MODEL_LOAD_BACKOFF) while another eligible
worker has the model loaded: a worker's record can say a model is loaded that
its process no longer has (a restarted process preloading, an eviction not yet
published).

A worker whose stream broke, or that answered SHUTTING_DOWN, is out of
routing at once, not when its lease runs out or its record says it drains
(a gateway cut off from etcd would otherwise send every request there first
for the whole drain): it comes back when its health check answers SERVING
again (a restarted process does once its preloads are done and it has
registered), or when it registers another address. While every eligible worker is out, they
are tried anyway.

A worker id registered again on another address (a new process replacing one that still drains) gets a new link
for new requests; the old link is kept until the requests already on it are answered (the old process finishes
what it accepted), then closed. (It used to be closed at once, cancelling those requests, which were redone
elsewhere: nothing lost, but the old process's drain was wasted.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from sie.v1 import worker_pb2
from sie_common.cluster.cluster_store import WorkerRecord
from sie_common.edge.errors import status_reason
from sie_gateway.demand import DemandRecorder
from sie_gateway.routing import choose_worker
from sie_gateway.worker_link import Connect, WorkerLink, WorkerLost

log = logging.getLogger(__name__)

# A worker's refusal that means "not accepted here, send it elsewhere".
SHUTTING_DOWN = "SHUTTING_DOWN"
# Refusals that mean "the model is not loaded here": sent on when another eligible worker has it loaded.
NOT_LOADED_HERE = frozenset({"MODEL_LOADING", "MODEL_LOAD_BACKOFF"})
# A lost worker's health is checked after this delay, doubling up to the maximum.
PROBE_FIRST_DELAY_S = 0.2
PROBE_MAX_DELAY_S = 2.0
PROBE_TIMEOUT_S = 1.0

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
        # Links to an address a worker id left for another, each closing once its requests are answered.
        self._retiring: set[asyncio.Task[None]] = set()
        # Workers whose stream broke -> the task that checks their health until they serve again.
        self._lost: dict[str, asyncio.Task[None]] = {}

    def outstanding(self) -> dict[str, int]:
        return {worker_id: link.outstanding for worker_id, link in self._links.items()}

    @property
    def lost(self) -> frozenset[str]:
        """Workers out of routing because their stream broke."""
        return frozenset(self._lost)

    async def workers_changed(self, workers: Mapping[str, WorkerRecord]) -> None:
        """Close the links of workers that left the registry (their requests fail over); retire those of workers
        that registered another address (their requests are answered where they were sent)."""
        for worker_id, link in list(self._links.items()):
            record = workers.get(worker_id)
            if record is None:
                await self._forget(worker_id)
            elif record.address != link.address:
                self._retire(worker_id)

    async def dispatch(
        self, task: str, message: Any, *, model: str, candidates: Candidates, deadline: float | None
    ) -> worker_pb2.WorkResponse:
        """The answer of the first worker that does not vanish; `deadline` is a time.monotonic() value."""
        tried: set[str] = set()
        cold_answer: worker_pb2.WorkResponse | None = None
        for _ in range(self._max_attempts):
            eligible = candidates(tried)
            reachable = [worker for worker in eligible if worker.worker_id not in self._lost]
            worker = choose_worker(reachable or eligible, model, self.outstanding())
            if worker is None:
                break
            timeout_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            serving = (
                self._demand.serving(worker.machine_profile, worker.pool) if self._demand else contextlib.nullcontext()
            )
            link = self._link(worker)
            try:
                with serving:
                    response = await link.call(task, message, timeout_s=timeout_s)
            except WorkerLost:
                tried.add(worker.worker_id)
                self._lose(link, "its Work stream broke")
                continue
            tried.add(worker.worker_id)
            reason = status_reason(response.error) if response.WhichOneof("outcome") == "error" else ""
            if reason == SHUTTING_DOWN:
                self._lose(link, "it is draining (SHUTTING_DOWN)")
                continue
            if reason in NOT_LOADED_HERE and self._warm(candidates(tried), model):
                cold_answer = response
                continue
            return response
        if cold_answer is not None:  # the warm workers were lost under it: the cold worker's answer stands
            return cold_answer
        raise NoWorker(tried)

    def _warm(self, workers: Sequence[WorkerRecord], model: str) -> bool:
        """Whether one of `workers`, not lost, has `model` loaded."""
        return any(model in worker.loaded_models and worker.worker_id not in self._lost for worker in workers)

    def _lose(self, link: WorkerLink, why: str) -> None:
        """Take a worker out of routing until its health check answers SERVING (or it leaves the registry); not if
        `link` is no longer its link (an old address it left for another)."""
        worker_id = link.worker_id
        if self._links.get(worker_id) is link and worker_id not in self._lost:
            log.warning("worker %s is out of routing: %s", worker_id, why)
            self._lost[worker_id] = asyncio.create_task(self._until_serving(worker_id, link))

    async def _until_serving(self, worker_id: str, link: WorkerLink) -> None:
        """Check the worker's health until it serves; then (or if the check itself fails) it is back in routing."""
        try:
            delay = PROBE_FIRST_DELAY_S
            while not await link.serving(PROBE_TIMEOUT_S):
                await asyncio.sleep(delay)
                delay = min(2 * delay, PROBE_MAX_DELAY_S)
            log.info("worker %s is back in routing: its health check says SERVING", worker_id)
        finally:
            if self._lost.get(worker_id) is asyncio.current_task():  # not forgotten (and cancelled) meanwhile
                del self._lost[worker_id]

    async def _forget(self, worker_id: str) -> None:
        probe = self._lost.pop(worker_id, None)
        if probe is not None:
            probe.cancel()
        await self._links.pop(worker_id).close()

    def _retire(self, worker_id: str) -> None:
        """Take a worker's link out of use, and close it once the requests on it are answered."""
        probe = self._lost.pop(worker_id, None)
        if probe is not None:
            probe.cancel()
        link = self._links.pop(worker_id)
        log.info(
            "worker %s left %s for another address; finishing %d requests there",
            worker_id,
            link.address,
            link.outstanding,
        )
        task = asyncio.create_task(link.close_when_quiet(), name=f"retire-link:{worker_id}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _link(self, worker: WorkerRecord) -> WorkerLink:
        link = self._links.get(worker.worker_id)
        if link is not None and link.address != worker.address:
            self._retire(worker.worker_id)
            link = None
        if link is None:
            channel = self._connect(worker.address) if self._connect is not None else None
            link = WorkerLink(worker.worker_id, worker.address, window=self._window, channel=channel)
            self._links[worker.worker_id] = link
        return link

    async def close(self) -> None:
        await self.workers_changed({})
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
