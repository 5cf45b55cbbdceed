"""Logging set-up shared by every service: plain text, or one JSON object per line (SIE_LOG_JSON).

A JSON line always has timestamp, level, logger and message; model,
request_id, trace_id and latency_ms are added when known. Request code binds
model and request_id with `request_fields` (a context variable, so concurrent
requests on one event loop keep theirs apart); trace_id comes from the current
OpenTelemetry span; latency_ms rides in a record's `extra`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from opentelemetry import trace

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_request: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "sie_request_fields", default=MappingProxyType({})
)


@contextlib.contextmanager
def request_fields(*, model: str, request_id: str) -> Iterator[None]:
    """Tag every log line written inside this block (in this task and the tasks it starts) with the request."""
    token = _request.set({"model": model, "request_id": request_id})
    try:
        yield
    finally:
        _request.reset(token)


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits, or None outside a trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({name: value for name, value in _request.get().items() if value})
        trace_id = current_trace_id()
        if trace_id:
            line["trace_id"] = trace_id
        latency_ms = getattr(record, "latency_ms", None)
        if latency_ms is not None:
            line["latency_ms"] = round(float(latency_ms), 3)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str, *, json_lines: bool) -> None:
    """Send every logger's records (and Python warnings) to stderr at `level`, as text or JSON lines.

    With JSON lines, Hugging Face progress bars are turned off (they are not log records and would
    break the one-object-per-line stream); call this before transformers is imported."""
    if json_lines:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)
