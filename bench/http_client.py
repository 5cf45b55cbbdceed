"""A JSON-over-HTTP `Send` with one keep-alive connection per client thread (stdlib only)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from workloads import Send


def json_sender(port: int, path: str, body: Callable[[Sequence[str]], dict[str, Any]], results_key: str) -> Send:
    """POST `body(texts)` to 127.0.0.1:`port``path`; the answer's `results_key` list is what came back."""
    local = threading.local()

    def send(texts: Sequence[str]) -> int:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        connection.request("POST", path, json.dumps(body(texts)), {"Content-Type": "application/json", "Accept": "application/json"})
        reply = connection.getresponse()
        payload = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"POST {path} answered {reply.status}: {payload[:300]!r}")
        return len(json.loads(payload)[results_key])

    return send
