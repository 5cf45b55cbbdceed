"""OpenTelemetry tracing for every service, on with SIE_TRACING_ENABLED.

The standard OTEL_* variables apply (OTEL_SERVICE_NAME, OTEL_TRACES_EXPORTER,
OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...). gRPC server
and client calls of the public APIs get spans from
opentelemetry-instrumentation-grpc; etcd traffic, health checks and the
long-lived Work streams do not. A request on a Work stream carries its own
trace context (W3C traceparent in `WorkRequest.trace_context`), because one
stream multiplexes requests of many traces.

When tracing is off no SDK is installed, request code starts no spans (`span`
hands back an empty context manager) and nothing is exported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)

TRACER = trace.get_tracer("sie")
# Only calls of these services get automatic spans.
TRACED_SERVICES = ("sie.v1.Inference", "sie.v1.ConfigService")
# The span name of one request on a Work stream, on both sides.
WORK_METHOD = "sie.v1.Worker/Work"
# Set by configure_tracing; while False the per-request helpers below do nothing at all.
_enabled = False
_NO_SPAN = contextlib.nullcontext()


def configure_tracing(enabled: bool, default_service_name: str) -> None:
    """Install the SDK with the exporters OTEL_TRACES_EXPORTER names and instrument grpc.aio servers and channels.

    Call once, before any gRPC server or channel is made."""
    global _enabled  # noqa: PLW0603 - one switch per process, set once at start
    if not enabled:
        return
    _enabled = True
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer, filters
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER(_ARG)
    for name in (part.strip() for part in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name not in ("none", ""):
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: expected otlp, console or none")
    trace.set_tracer_provider(provider)
    traced = filters.any_of(*(filters.service_name(service) for service in TRACED_SERVICES))
    GrpcAioInstrumentorServer(filter_=traced).instrument()
    GrpcAioInstrumentorClient(filter_=traced).instrument()
    log.info(
        "tracing on: service %s, exporters %s",
        resource.attributes[SERVICE_NAME],
        os.environ.get("OTEL_TRACES_EXPORTER", "otlp"),
    )


def span(name: str, **options: Any) -> contextlib.AbstractContextManager[Any]:
    """TRACER.start_as_current_span(name, **options); with tracing off, not even the API's no-op span, whose
    context switching is measurable on a request's hot path (docs/benchmarks.md, the gateway hop)."""
    return TRACER.start_as_current_span(name, **options) if _enabled else _NO_SPAN


def inject(carrier: MutableMapping[str, str]) -> None:
    """Write the current trace context (traceparent, tracestate) into `carrier`; nothing with tracing off."""
    if _enabled:
        propagate.inject(carrier)


def extract(carrier: Mapping[str, str]) -> context.Context:
    """The trace context a caller wrote with `inject`."""
    return propagate.extract(carrier)


def recording() -> bool:
    """Whether spans started now would be recorded (tracing on and the current trace sampled)."""
    return trace.get_current_span().is_recording()


def record_span(name: str, start_monotonic: float, end_monotonic: float, attributes: Attributes = None) -> None:
    """A finished child span of the current one, for a stretch of time measured with time.monotonic().

    Nothing is recorded outside a sampled span (tracing off, or not sampled)."""
    if not recording():
        return
    span = TRACER.start_span(name, start_time=_epoch_ns(start_monotonic), attributes=attributes)
    span.end(end_time=_epoch_ns(end_monotonic))


def _epoch_ns(monotonic_s: float) -> int:
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)
