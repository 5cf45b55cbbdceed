"""Per-request accounting every service shares: a count by model, operation and
status, a latency histogram, a DEBUG log line with the latency, and the
request's model and request_id on every log line written meanwhile.

Labels go through closed sets (sie_common.runtime.metric_labels): the service's
models (bound when it starts, `models.follow`), its operations and the gRPC
status codes; a model name nobody configured, whatever the refusal, is counted
as "(unknown)"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from sie_common.edge.errors import SieError
from sie_common.runtime.logs import request_fields
from sie_common.runtime.metric_labels import STATUS_CODES, ClosedSet, counter, histogram
from sie_common.runtime.metrics_server import LATENCY_BUCKETS_S

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The StatusCode of a google.rpc.Status `code`."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)


@dataclass
class Outcome:
    """What became of a request: callers that end a request without raising (an abort) say why."""

    status: grpc.StatusCode = grpc.StatusCode.OK

    def failed(self, error: SieError) -> None:
        self.status = error.code


class RequestMetrics:
    def __init__(self, service: str, models: ClosedSet, operations: ClosedSet) -> None:
        """Metrics `sie_<service>_requests_total` and `sie_<service>_request_duration_seconds`, labelled by
        `models` and `operations`."""
        self.requests = counter(
            f"sie_{service}_requests",
            "Requests answered, by model, operation and gRPC status code",
            {"model": models, "operation": operations, "status": STATUS_CODES},
        )
        self.seconds = histogram(
            f"sie_{service}_request_duration_seconds",
            "Time from receipt to answer of a request, whatever its status",
            {"model": models, "operation": operations},
            LATENCY_BUCKETS_S,
        )
        self._log = logging.getLogger(f"sie_{service}.requests")

    @contextlib.contextmanager
    def observe(self, operation: str, model: str, request_id: str) -> Iterator[Outcome]:
        """Account for the request that runs in this block (in a request handler, on the server's event loop);
        a SieError or cancellation raised out of it sets its status."""
        outcome = Outcome()
        started = time.perf_counter()
        with request_fields(model=model, request_id=request_id):
            try:
                yield outcome
            except SieError as error:
                outcome.failed(error)
                raise
            except asyncio.CancelledError:
                outcome.status = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                if outcome.status == grpc.StatusCode.OK:
                    outcome.status = grpc.StatusCode.UNKNOWN
                raise
            finally:
                seconds = time.perf_counter() - started
                # Counted once the answer is on its way (the event loop's next turn, in this request's context,
                # so the log line keeps its fields): not on the request's path.
                asyncio.get_running_loop().call_soon(self._record, model, operation, outcome.status.name, seconds)

    def _record(self, model: str, operation: str, status: str, seconds: float) -> None:
        self.requests.labels(model, operation, status).inc()
        self.seconds.labels(model, operation).observe(seconds)
        self._log.debug("%s answered %s", operation, status, extra={"latency_ms": seconds * 1000})
