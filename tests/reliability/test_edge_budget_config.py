"""Envoy's config refuses a body budget too small for the largest body it takes. With `sie envoy-config
--max-heap-bytes 100663296` (96 MiB, with the default 16 MiB body limit) one client may hold 8 MiB of a thread's
budget, so every body over 8 MiB was refused 503 OVERLOADED with `retry-after: 1` on an idle Envoy, for ever, and a
client that retries as told never stopped (issue 32, attack round 4). The renderer (and so the CLI) now refuses such a
configuration, naming the knobs to change. In process: the renderer and the CLI's exit status."""

from __future__ import annotations

import pytest

from sie_stack.cli import main
from sie_stack.envoy_config import render

MB = 2**20
ADDRESSES = {"listen_port": 8080, "admin_port": 9901, "gateway": "127.0.0.1:1", "config": "127.0.0.1:2"}


@pytest.mark.parametrize(
    "options",
    [
        {"max_heap_bytes": 96 * MB},
        {"peer_body_share": 0.2},
        {"max_request_bytes": 40 * MB},
        {"max_request_bytes": 50 * MB, "peer_body_share": 1.0},  # three quarters of 64 MiB: 48 MiB
        {"max_heap_bytes": 96 * MB, "peer_body_share": 1.0, "max_request_bytes": 13 * MB},
    ],
)
def test_a_budget_no_largest_body_fits_is_refused(options: dict) -> None:
    with pytest.raises(ValueError, match="would never fit"):
        render(**ADDRESSES, **options)


def test_budgets_the_largest_body_fits_are_taken() -> None:
    render(**ADDRESSES)
    render(**ADDRESSES, max_heap_bytes=96 * MB, peer_body_share=1.0, max_request_bytes=12 * MB)
    render(**ADDRESSES, max_request_bytes=32 * MB)


def test_the_cli_refuses_it_with_usage_status(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["envoy-config", "--gateway", "127.0.0.1:1", "--config", "127.0.0.1:2", "--max-heap-bytes", str(96 * MB)])
    assert exited.value.code == 2
    assert "raise max_heap_bytes or peer_body_share" in capsys.readouterr().err
