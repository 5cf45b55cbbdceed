"""Logging set-up shared by every service: plain text, or one JSON object per line (SIE_LOG_JSON).

No string a caller or a config supplies can forge a log line: a text record is
one line, its control characters (newline, carriage return, escape, ...)
written as escapes (`\\n`, `\\x1b`), and the lines of a traceback after it are
indented (CONTINUATION), so every line that starts at column 0 is a record's
first. JSON lines quote every string.

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
import re
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from opentelemetry import trace

from sie_common.edge.errors import clipped

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What starts each line of a text record's traceback or stack.
CONTINUATION = "    "

# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators: each can end a line or
# rewrite what a terminal shows.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Characters of a request's model and request_id a log line carries (a caller may send megabytes of either).
FIELD_CHARS = 256
# Those json.dumps leaves as they are (it escapes only C0): a reader that splits on any line break would split on them.
_JSON_UNESCAPED = re.compile("[\x7f-\x9f\u2028\u2029]")

_request: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "sie_request_fields", default=MappingProxyType({})
)


@contextlib.contextmanager
def request_fields(*, model: str, request_id: str) -> Iterator[None]:
    """Tag every log line written inside this block (in this task and the tasks it starts) with the request."""
    token = _request.set({"model": clipped(model, FIELD_CHARS), "request_id": clipped(request_id, FIELD_CHARS)})
    try:
        yield
    finally:
        _request.reset(token)


def current_trace_id() -> str | None:
    """The current span's trace id as 32 hex digits, or None outside a trace."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape (`\\n`, `\\r`, `\\t`, `\\xNN`, `\\uNNNN`)."""
    return _CONTROLS.sub(lambda match: _NAMED.get(match[0]) or ascii(match[0])[1:-1], text)


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT on one line, escaped; a traceback or stack follows on lines that start with CONTINUATION."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        line = escape_controls(self.formatMessage(record))
        details = []
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            details.append(record.exc_text)
        if record.stack_info:
            details.append(self.formatStack(record.stack_info))
        for detail in details:
            line += "".join("\n" + CONTINUATION + escape_controls(part) for part in detail.splitlines())
        return line


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
        return _JSON_UNESCAPED.sub(lambda match: f"\\u{ord(match[0]):04x}", json.dumps(line, ensure_ascii=False))


def _turn_off_imported_progress_bars() -> None:
    """huggingface_hub and transformers read HF_HUB_DISABLE_PROGRESS_BARS once, when imported: where they already
    are (a process forked after its imports, as the test suite's services are), turn their bars off directly."""
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").upper() not in {"1", "ON", "YES", "TRUE"}:
        return
    hub = sys.modules.get("huggingface_hub.utils")
    if hub is not None:
        hub.disable_progress_bars()
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        transformers_logging.disable_progress_bar()


def configure_logging(level: str, *, json_lines: bool) -> None:
    """Send every logger's records (and Python warnings) to stderr at `level`, as text or JSON lines.

    With JSON lines, Hugging Face progress bars are turned off (they are not log records and would
    break the one-object-per-line stream), unless HF_HUB_DISABLE_PROGRESS_BARS says otherwise."""
    if json_lines:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        _turn_off_imported_progress_bars()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)
