"""No caller- or config-supplied string can forge a log line (issue 32, defect 8: a profile name with a newline
forged one). The logging layer itself escapes: a text record is one line, its control characters written as
escapes, a traceback's lines indented after it; JSON lines quote every string, line separators included."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from local_cluster import etcd_call, wait_until
from sie_common.cluster import config_store
from sie_common.cluster.etcd import Etcd
from sie_common.runtime.logs import JsonFormatter

FORGED = "2026-01-01 00:00:00,000 ERROR sie_worker.server: forged"
# Every way a string can end a line or rewrite a terminal.
BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
TEXT_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("sie_test.log_injection")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, stream, handler
    logger.removeHandler(handler)


def test_a_text_record_is_one_line_whatever_its_message_holds(captured) -> None:
    from sie_common.runtime.logs import TextFormatter

    logger, stream, handler = captured
    handler.setFormatter(TextFormatter())
    for separator in BREAKS:
        logger.error("model %s: added profiles %s", "org/m", f"x{separator}{FORGED}")
    logger.warning("terminal: %s", "\x1b[2J\x1b[1;1Hcleared\x00\x7f")
    lines = stream.getvalue().split("\n")[:-1]
    assert len(lines) == len(BREAKS) + 1
    assert all(TEXT_RECORD.match(line) for line in lines)
    for line in lines:
        assert not any(character in line for character in "".join(BREAKS) + "\x1b\x00\x7f"), line
    assert lines[0].endswith("added profiles x\\n" + FORGED)
    assert lines[-1].endswith("terminal: \\x1b[2J\\x1b[1;1Hcleared\\x00\\x7f")


def test_a_traceback_follows_on_indented_lines_so_it_cannot_start_a_record(captured) -> None:
    from sie_common.runtime.logs import CONTINUATION, TextFormatter

    logger, stream, handler = captured
    handler.setFormatter(TextFormatter())
    try:
        raise ValueError(f"bad profile x\n{FORGED}\r{FORGED}\u2028{FORGED}")
    except ValueError:
        logger.exception("request %s failed", "r\n" + FORGED)
    logger.info("after", stack_info=True)
    lines = stream.getvalue().split("\n")[:-1]
    records = [line for line in lines if not line.startswith(CONTINUATION)]
    assert len(records) == 2 and all(TEXT_RECORD.match(line) for line in records)
    assert records[0].endswith("request r\\n" + FORGED + " failed")
    continuation = [line for line in lines if line.startswith(CONTINUATION)]
    assert any("Traceback (most recent call last):" in line for line in continuation)
    assert sum(FORGED in line for line in continuation) == 3  # the exception's message, each part indented
    assert any("Stack (most recent call last):" in line for line in continuation)


def test_a_json_line_quotes_every_line_break(captured) -> None:
    logger, stream, handler = captured
    handler.setFormatter(JsonFormatter())
    for separator in BREAKS:
        logger.error("profile %s", f"x{separator}{FORGED}")
    text = stream.getvalue()
    assert text.count("\n") == len(BREAKS)
    lines = text.splitlines()  # splits on every Unicode line break, as some log readers do
    assert len(lines) == len(BREAKS)
    assert [json.loads(line)["message"] for line in lines] == [f"profile x{separator}{FORGED}" for separator in BREAKS]


def test_a_hostile_config_in_etcd_cannot_forge_a_line_of_the_worker_or_gateway_log(cluster, etcd_server, etcd_prefix) -> None:
    """A config written straight into etcd with a field name carrying line breaks: the worker and the gateway log
    that they ignore it, each on one line."""
    hostile = {"id": "test/hostile", "path": "/x", f"typo\n{FORGED}\r\n{FORGED}\u2028": 1, "profiles": {"default": {"adapter": "sentence_transformer"}}}

    async def put(etcd: Etcd) -> None:
        await etcd.put(config_store.model_name("test/hostile"), json.dumps(hostile).encode())

    etcd_call(etcd_server.endpoint, etcd_prefix, put)
    worker = cluster.start_worker("logging-worker")
    gateway = cluster.start_gateway()
    for process in (worker, gateway):
        wait_until(lambda: "ignoring a stored value that does not validate" in process.log(), what="the ignored config in the log")
        log = process.log()
        assert "forged" in log
        for line in log.split("\n"):
            assert "forged" not in line or "ignoring a stored value that does not validate" in line, line
            assert not any(character in line for character in "\r\u2028")


def test_a_request_s_megabyte_model_name_does_not_make_a_megabyte_log_line(captured) -> None:
    from sie_common.runtime.logs import request_fields

    logger, stream, handler = captured
    handler.setFormatter(JsonFormatter())
    with request_fields(model="m" * 1_000_000, request_id="r" * 1_000_000):
        logger.error("refused")
    line = json.loads(stream.getvalue())
    assert len(stream.getvalue()) < 2048
    assert line["model"].startswith("m" * 256) and line["model"].endswith("(1000000 characters)")
